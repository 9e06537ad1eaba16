"""A connection's counters turn into per-second rates at each sample, from the previous one."""
from core.traffic import ClientCounters


def test_rates_are_the_counts_since_the_previous_sample_per_second():
    counters = ClientCounters(at=100.0)
    counters.published += 10
    counters.delivered += 4
    counters.sample(105.0)
    assert (counters.publish_rate, counters.deliver_rate) == (2.0, 0.8)
    counters.published += 3
    counters.sample(107.0)
    assert (counters.publish_rate, counters.deliver_rate) == (1.5, 0.0)
    assert (counters.published, counters.delivered) == (13, 4), "totals are never reset"


def test_a_sample_at_the_same_instant_keeps_the_rates():
    counters = ClientCounters(at=5.0)
    counters.published += 1
    counters.sample(10.0)
    counters.published += 100
    counters.sample(10.0)
    assert counters.publish_rate == 0.2
    counters.sample(11.0)
    assert counters.publish_rate == 100.0, "the counts of the skipped sample are not lost"
