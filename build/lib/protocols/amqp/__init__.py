"""AMQP 0-9-1 adapter: codec, connection state machine and mapping onto core."""
