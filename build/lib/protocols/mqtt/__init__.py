"""MQTT 3.1.1/5.0 adapter: codec, connection state machine and mapping onto core."""
