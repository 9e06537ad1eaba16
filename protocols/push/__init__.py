"""Push subscriptions delivered over HTTP: an outbound protocol adapter (``engine.PushEngine``)."""
