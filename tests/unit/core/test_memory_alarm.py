"""The memory alarm's raise and clear logic over a fake resident-memory reading, its watermark
setting, and the AMQP alarms that combine it with the disk alarm."""
from __future__ import annotations

import asyncio

import pytest

from core.memory_alarm import CLEAR_RATIO, MemoryAlarm, resident_bytes, watermark_bytes
from protocols.amqp.alarms import LOW_ON_DISK, LOW_ON_MEMORY, Alarms
from sluice.server.config import ConfigError, load_config

MIB = 1 << 20


class Reading:
    def __init__(self) -> None:
        self.value = 0

    def __call__(self) -> int:
        return self.value


def test_goes_on_above_the_mark_and_off_only_clearly_below_it():
    reading, changes = Reading(), []
    alarm = MemoryAlarm(100 * MIB, reading)
    assert alarm.watch(changes.append) is False
    for value, on in ((99 * MIB, False), (100 * MIB, False), (101 * MIB, True),
                      (99 * MIB, True),  # within the hysteresis: still on, no flapping
                      (int(100 * MIB * CLEAR_RATIO) - 1, False), (99 * MIB, False)):
        reading.value = value
        alarm.check()
        assert alarm.on is on, value
    assert changes == [True, False]
    assert alarm.resident == 99 * MIB


def test_a_failing_watcher_does_not_silence_the_others():
    reading, changes = Reading(), []
    alarm = MemoryAlarm(10, reading)
    alarm.watch(lambda on: 1 / 0)
    alarm.watch(changes.append)
    reading.value = 11
    alarm.check()
    assert changes == [True]


def test_reads_this_process_resident_memory():
    held = bytearray(32 * MIB)
    held[::4096] = b"x" * len(held[::4096])  # touch every page so it is resident
    assert resident_bytes() > 32 * MIB


def test_the_watermark_is_a_fraction_of_the_machine_memory(tmp_path):
    assert 0 < watermark_bytes(0.4) < watermark_bytes(0.8)
    config = tmp_path / "sluice.toml"
    for bad in ("0", "0.0", "1.5", "-0.1"):
        config.write_text(f"[core]\nmemory_high_watermark = {bad}\n")
        with pytest.raises(ConfigError, match="memory_high_watermark .* fraction"):
            load_config(config)
    config.write_text("[core]\nmemory_high_watermark = 0.25\n")
    assert load_config(config).core.memory_high_watermark == 0.25


class Connection:
    def __init__(self, alarms: Alarms) -> None:
        self.alarms, self.seen = alarms, []

    def alarm_changed(self) -> None:
        self.seen.append(self.alarms.reason)


def test_publishers_stay_blocked_until_both_alarms_clear():
    alarms = Alarms()
    connection = Connection(alarms)
    alarms.add(connection)
    alarms.memory(True)
    assert connection.seen == [LOW_ON_MEMORY]
    alarms.store_health("ENOSPC")
    alarms.memory(False)
    assert alarms.reason == LOW_ON_DISK and connection.seen == [LOW_ON_MEMORY]
    alarms.memory(True)
    alarms.store_health(None)
    assert alarms.reason == LOW_ON_MEMORY and connection.seen == [LOW_ON_MEMORY]
    alarms.memory(False)
    assert alarms.reason is None and connection.seen == [LOW_ON_MEMORY, None]


def test_freed_memory_the_allocator_keeps_is_given_back_before_deciding():
    reading, releases = Reading(), []

    def release() -> None:  # as malloc_trim: what was freed leaves the resident set
        releases.append(reading.value)
        reading.value -= 30 * MIB

    alarm = MemoryAlarm(100 * MIB, reading, release)
    reading.value = 90 * MIB
    alarm.check()
    assert releases == [] and alarm.on is False  # no heap walk while memory is low
    reading.value = 120 * MIB
    alarm.check()
    assert releases == [120 * MIB] and alarm.on is False and alarm.resident == 90 * MIB




def test_checks_once_a_second_on_the_loop_and_stops_where_memory_cannot_be_read(caplog):
    readings: list[float] = []

    async def main() -> MemoryAlarm:
        loop = asyncio.get_running_loop()
        failed = asyncio.Event()

        def read() -> int:
            readings.append(loop.time())
            if len(readings) < 4:  # 100, then 150 (above the mark) read again after release
                return 100 if len(readings) == 1 else 150
            failed.set()
            raise OSError("no /proc")

        alarm = MemoryAlarm(120, read, lambda: None)
        alarm.start()
        assert readings and not alarm.on
        await asyncio.wait_for(failed.wait(), 10)
        return alarm

    alarm = asyncio.run(main())
    assert alarm.on and alarm.resident == 150
    assert [round(b - a, 1) for a, b in zip(readings, readings[1:])] == [1.0, 0.0, 1.0]
    assert "cannot be read" in caplog.text
    assert alarm._timer is None  # no further checks, no log line every second
