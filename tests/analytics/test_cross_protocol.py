"""Spark reads what MQTT and AMQP publish to the same subjects, from a running broker and from
its data directory: one row per message (stored once, whatever queues it was also indexed
into), the MQTT topic as ``subject`` and each protocol's properties in ``properties``."""
from __future__ import annotations

import paho.mqtt.client as mqtt
import pika

from tests.integration.amqp.conftest import SLUICE_PASSWORD, SLUICE_USER, connect
from tests.integration.mqtt.test_robustness import PahoClient


def test_spark_reads_mqtt_and_amqp_publishes_with_their_properties(spark, sluice_server,
                                                                   tmp_path):
    server = sluice_server(tmp_path / "data")
    server.wait_ready()
    connection = connect(server)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("all-telemetry")
    channel.queue_bind("all-telemetry", "amq.topic", "devices.*.telemetry")
    publisher = PahoClient(server.mqtt, "m1", username=SLUICE_USER, password=SLUICE_PASSWORD,
                           version=mqtt.MQTTv5)
    try:
        publisher.publish("devices/m1/telemetry", b"from mqtt", qos=1)
    finally:
        publisher.stop()
    channel.basic_publish("amq.topic", "devices.a1.telemetry", b"from amqp",
                          pika.BasicProperties(content_type="text/plain", delivery_mode=2))
    connection.close()

    frame = (spark.read.format("sluice").option("endpoint", server.native)
             .option("user", SLUICE_USER).option("password", SLUICE_PASSWORD)
             .option("subscribe", "devices").load())
    collected = frame.select("subject", "properties", "body").collect()
    assert sorted(bytes(row.body) for row in collected) == [b"from amqp", b"from mqtt"], \
        "one row per message"
    rows = {bytes(row.body): row for row in collected}
    mqtt_row, amqp_row = rows[b"from mqtt"], rows[b"from amqp"]
    assert mqtt_row.subject == "devices/m1/telemetry"
    assert (mqtt_row.properties["mqtt.qos"], mqtt_row.properties["mqtt.client"]) == ("1", "m1")
    assert amqp_row.subject == "devices/a1/telemetry"
    assert (amqp_row.properties["amqp.content_type"], amqp_row.properties["amqp.routing_key"],
            amqp_row.properties["amqp.delivery_mode"]) == \
        ("text/plain", "devices.a1.telemetry", "2")

    assert server.stop() == 0  # the data directory reads the same
    local = (spark.read.format("sluice").option("subscribe", "devices")
             .load(str(tmp_path / "data")).select("subject", "properties", "body").collect())
    assert sorted((row.subject, bytes(row.body), sorted(row.properties.items()))
                  for row in local) == \
        sorted((row.subject, bytes(row.body), sorted(row.properties.items()))
               for row in collected)
