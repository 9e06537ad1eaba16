"""The simulated fleet: realistic, reproducible readings with gaps and anomalies."""
from __future__ import annotations

import itertools
import json
from collections import Counter

from sluice.cli.simulator import Fleet, FleetModel


def take(fleet: Fleet, count: int) -> list[tuple[str, dict]]:
    return [(topic, json.loads(payload))
            for topic, payload in itertools.islice(fleet.readings(lambda: 1_700_000_000_000), count)]


def test_the_same_seed_gives_the_same_readings():
    assert take(Fleet(10, seed=3), 200) == take(Fleet(10, seed=3), 200)
    assert take(Fleet(10, seed=3), 200) != take(Fleet(10, seed=4), 200)


def test_readings_carry_every_field_on_the_devices_topic():
    for topic, reading in take(Fleet(5), 50):
        assert topic == f"devices/{reading['device']}/telemetry"
        assert set(reading) == {"device", "ts", "temperature", "humidity", "battery", "anomaly"}
        assert 0 <= reading["humidity"] <= 105 and 0 <= reading["battery"] <= 100


def test_gaps_and_anomalies_happen_at_their_rates():
    model = FleetModel(gap_probability=0.01, gap_readings=5, anomaly_probability=0.02)
    readings = take(Fleet(20, seed=9, model=model), 20_000)
    per_device = Counter(reading["device"] for _, reading in readings)
    assert min(per_device.values()) < max(per_device.values())  # some devices went quiet a while
    anomalies = [reading for _, reading in readings if reading["anomaly"]]
    assert 200 < len(anomalies) < 600
    normal = [reading["temperature"] for _, reading in readings if not reading["anomaly"]]
    assert max(abs(a["temperature"] - sum(normal) / len(normal)) for a in anomalies) > 15
