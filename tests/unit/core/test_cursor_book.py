"""Consumer offsets kept in the log: only consumers whose cursors changed are stored again, a
consumer that is gone is stored as empty (compaction then forgets it), and a book loads back
what was stored."""
from __future__ import annotations

from core.cursors import CursorBook


def test_only_changed_consumers_are_stored_and_a_gone_one_as_empty(tmp_path):
    book = CursorBook(str(tmp_path), from_file=False)
    book.open(("g1", "orders", 0), 5)
    book.open(("g2", "orders", 1), 7)
    first = book.changed_consumers()
    assert set(first) == {"g1", "g2"}
    for consumer, data in first.items():
        book.stored(consumer, data)
    assert book.changed_consumers() == {}, "nothing moved: nothing to store"
    book.open(("g1", "orders", 0), 0).committed = 9
    assert set(book.changed_consumers()) == {"g1"}
    book.stored("g1", book.changed_consumers()["g1"])
    book.drop_consumer("g2")
    assert book.changed_consumers() == {"g2": b""}

    again = CursorBook(str(tmp_path), from_file=False)
    again.load_consumer("g1", first["g1"])
    assert again.get(("g1", "orders", 0)).committed == 5
    assert again.changed_consumers() == {}, "what was loaded counts as stored"
    assert not (tmp_path / "offsets.json").exists()
