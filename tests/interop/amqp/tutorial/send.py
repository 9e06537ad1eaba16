#!/usr/bin/env python
# RabbitMQ's tutorial one ("Hello World!", Python with pika), send.py as the tutorial writes
# it: publish one message without confirms, then close. Kept unchanged; the interop test runs it
# with pika's default port pointed at the broker under test (tests/interop/amqp/scenarios.py).
import pika

connection = pika.BlockingConnection(
    pika.ConnectionParameters(host='localhost'))
channel = connection.channel()

channel.queue_declare(queue='hello')

channel.basic_publish(exchange='', routing_key='hello', body='Hello World!')
print(" [x] Sent 'Hello World!'")
connection.close()
