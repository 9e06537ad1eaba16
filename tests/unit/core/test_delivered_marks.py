"""Delivered marks: written at each flush, read back after a crash (torn tail ignored, forgotten
queues dropped, compaction keeps every queue's mark), and a restored mark turning the next
delivery of what was below it into a redelivery."""
from __future__ import annotations

import asyncio

from core import delivered_marks
from core.assembly import Core
from core.cursors import Cursor, CursorBook
from core.delivered_marks import DeliveredMarks, read_marks
from core.model import SYSTEM

from tests.unit.core.test_broker import CONFIG, STATE_HOMES, run_core, topic
from tests.unit.core.test_fanout import subject


def test_marks_survive_a_reopen_and_a_torn_last_line_is_ignored(tmp_path):
    marks = DeliveredMarks(str(tmp_path))
    marks.mark("a", 3)
    marks.mark("a", 2)  # a mark never moves back
    marks.mark("b", 7)
    marks.mark("gone", 1)
    marks.forget("gone")
    marks.flush()
    marks.mark("b", 9)  # taken, never flushed: lost with the process
    # no close: a SIGKILL leaves what was written; a torn line follows
    with open(marks.path, "ab") as file:
        file.write(b"a 99")
    again = DeliveredMarks(str(tmp_path))
    assert (again.restored("a"), again.restored("b"), again.restored("gone")) == (3, 7, None)
    assert again.restored("a") is None, "a restored mark is handed out once"


def test_compaction_keeps_one_line_per_queue(tmp_path, monkeypatch):
    monkeypatch.setattr(delivered_marks, "COMPACT_BYTES", 200)
    marks = DeliveredMarks(str(tmp_path))
    for offset in range(1, 100):
        marks.mark("q", offset)
        marks.mark("r", offset * 2)
        marks.flush()
    marks.close()
    with open(marks.path, "rb") as file:
        assert len(file.read()) < 400
    assert read_marks(marks.path) == {"q": 99, "r": 198}


def test_a_restored_mark_makes_the_next_delivery_a_redelivery():
    cursor = Cursor(committed=10, next=10, acked={12})
    cursor.delivered_below(14)
    attempts = [cursor.deliver(offset, 0, 1000).attempt for offset in (10, 11, 13, 14)]
    assert attempts == [2, 2, 2, 1]


def test_a_full_disk_drops_marks_with_one_warning_and_writing_resumes_after(tmp_path, caplog):
    """Writing to /dev/full fails with ENOSPC, as a full disk does: flushes go on without
    raising (deliveries must not stop), one warning says what is at stake, and marks are
    written again once the file takes them."""
    marks = DeliveredMarks(str(tmp_path))  # (reading /dev/full would never end: link it after)
    path = tmp_path / delivered_marks.FILE_NAME
    path.symlink_to("/dev/full")
    caplog.set_level("INFO", logger=delivered_marks.__name__)
    for offset in (1, 2, 3):
        marks.mark("q", offset)
        marks.flush()
    assert marks.failing
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "redelivered=false" in caplog.records[0].getMessage()
    path.unlink()  # space again
    marks.mark("q", 4)
    marks.flush()
    assert not marks.failing and "written" in caplog.records[-1].getMessage()
    assert read_marks(marks.path) == {"q": 4}


@STATE_HOMES
def test_what_was_popped_comes_back_as_a_redelivery_after_a_crash(tmp_path, config, monkeypatch):
    """Marks kept in ``delivered.log`` on a single node, in the replicated log's compacted
    ``%SYS%delivered`` on a group's node (where the next leader finds them); a queue deleted
    and declared again starts unmarked in both. The crash comes before consumer offsets
    (which count deliveries too) were ever saved."""
    monkeypatch.setattr(CursorBook, "write", lambda self, snapshot: None)
    monkeypatch.setattr(CursorBook, "changed_consumers", lambda self: {})

    async def first(core: Core) -> None:
        await topic(core.broker, "work", queues=1)
        for queue in ("q", "gone"):
            core.queues.bind("work/#", queue)
        await core.broker.send(SYSTEM, [subject("work", b"%d" % i, "work/x") for i in range(5)])
        for queue in ("q", "gone"):
            assert len(core.queues.pop(queue, 3, 60_000, mark=True)) == 3
        core.queues.flush_marks()
        core.queues.forget("gone")

    async def second(core: Core) -> None:
        for queue in ("q", "gone"):
            core.queues.bind("work/#", queue)
        again = core.queues.pop("q", 10, 60_000, mark=True)
        assert [(d.body, d.attempt) for d in again] == [(b"0", 2), (b"1", 2), (b"2", 2), (b"3", 1), (b"4", 1)]
        assert {d.attempt for d in core.queues.pop("gone", 10, 60_000)} == {1}
    run_core(tmp_path, first, store="file", config=config)
    monkeypatch.undo()
    run_core(tmp_path, second, store="file", config=config)
    assert (tmp_path / delivered_marks.FILE_NAME).exists() is (config is CONFIG), "marks in the log need no side file"


def test_a_held_sink_gets_one_write_for_the_flushes_within_its_hold():
    """A group's node appends marks to the log at most every ``hold_s``: the marks of every
    flush meanwhile go in one write (here: the one ``close`` makes)."""
    class Recording:
        where = "memory"

        def __init__(self) -> None:
            self.writes: list[dict[str, int]] = []

        def read(self) -> dict[str, int]:
            return {}

        def write(self, changed: dict[str, int], every: dict[str, int]) -> None:
            self.writes.append(dict(changed))

        def close(self) -> None:
            pass

    async def scenario() -> list[dict[str, int]]:
        sink = Recording()
        marks = DeliveredMarks(sink, hold_s=60)
        for offset in range(1, 11):
            marks.mark("q", offset)
            marks.mark(f"r{offset % 2}", offset)
            marks.flush()
        assert sink.writes == [], "held: nothing written yet"
        marks.close()
        return sink.writes
    assert asyncio.run(scenario()) == [{"q": 10, "r1": 9, "r0": 10}]
