"""Load generators and side-by-side benchmarks against Mosquitto and RabbitMQ."""
