"""Domain core: topics, queues, messages, consumer groups, routing, delivery and the service facade."""
