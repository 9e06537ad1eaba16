"""Native gRPC adapter (RocketMQ 5 API) and, under `sdk`, its Python client SDK."""
