"""Key lookups under forged hash collisions: one topic's records never hide another's.

An index that keeps only a CRC32C of each key can be collided on purpose (CRC32C is linear:
``tests/crc32c_collisions.py``). These tests forge keys and ids in an attacker's topic whose
index keys, as a CRC32C-only index would hash them, equal the victim's, and check that the
victim's lookups still return exactly the victim's records. Every test runs against FileStore
and MemoryStore.
"""
from __future__ import annotations

import itertools

from crc32c import crc32c

import store.key_index as store_key_index
from store.api import Message
from store.file_store import FileStore
from tests.crc32c_collisions import colliding_strings

WAIT = 120  # seconds: only guards against hanging


def visible(store, results):
    assert store.wait_visible(results[-1].end_offset, timeout=WAIT)
    return results


def key_bytes(topic: str, key: str) -> bytes:
    """How a CRC32C-only index saw a business key: scoped to its topic, then hashed."""
    return b"\x02" + topic.encode() + b"\x00" + key.encode()


def id_bytes(msg_id: str) -> bytes:
    """How a CRC32C-only index saw a message id: one key for every topic."""
    return b"\x01" + msg_id.encode()


def forged_keys(target: bytes, topic: str, count: int) -> list[str]:
    """``count`` business keys of ``topic`` whose index key has the CRC32C of ``target``."""
    found = colliding_strings(lambda s: key_bytes(topic, s), crc32c(target))
    return list(itertools.islice(found, count))


def test_colliding_keys_in_one_topic_do_not_crowd_out_another_topics_key(store):
    mine = visible(store, [store.append("victim", b"v%d" % i, keys=["order-7"]) for i in range(3)])
    forged = forged_keys(key_bytes("victim", "order-7"), "attacker", 300)
    visible(store, store.append_batch([Message("attacker", b"x", keys=[k]) for k in forged]))

    newest_first = [r.phys_offset for r in reversed(mine)]
    assert [m.phys_offset for m in store.lookup_key("victim", "order-7")] == newest_first
    assert [m.phys_offset for m in store.lookup_key("victim", "order-7", limit=2)] == newest_first[:2]
    since = [m.phys_offset for m in store.lookup_key("victim", "order-7", since_ms=mine[0].store_ts)]
    assert since == newest_first
    assert [m.body for m in store.lookup_key("attacker", forged[0])] == [b"x"]


def test_colliding_ids_in_one_topic_do_not_hide_another_topics_message(store):
    [mine] = visible(store, [store.append("victim", b"mine", msg_id="order-7")])
    forged = list(itertools.islice(colliding_strings(id_bytes, crc32c(id_bytes("order-7"))), 300))
    visible(store, store.append_batch([Message("attacker", b"x", msg_id=i) for i in forged]))

    found = store.lookup_id("order-7", ["victim"])
    assert [m.phys_offset for m in found] == [mine.phys_offset]
    assert [m.body for m in store.lookup_id(forged[0], ["attacker"])] == [b"x"]


def test_candidates_that_fail_verification_never_hide_a_match(tmp_path, monkeypatch, config):
    """Were keys to collide anyway (here every key hashes alike), the lookup reads past every
    candidate that is not the key: no cap on candidates can be exhausted by another topic."""
    monkeypatch.setattr(store_key_index, "key_hasher", lambda secret: lambda key: 7)
    with FileStore(str(tmp_path / "data"), config) as store:
        mine = visible(store, [store.append("victim", b"v%d" % i, keys=["order-7"], msg_id="id-7")
                               for i in range(3)])
        visible(store, store.append_batch([Message("attacker", b"x", keys=["order-7"], msg_id="id-7")
                                           for _ in range(500)]))
        newest_first = [r.phys_offset for r in reversed(mine)]
        assert [m.phys_offset for m in store.lookup_key("victim", "order-7", limit=3)] == newest_first
        assert [m.phys_offset for m in store.lookup_id("id-7", ["victim"], limit=3)] == newest_first
        page = store.lookup_key_page("victim", "order-7", 2)
        assert [m.phys_offset for m in page.messages] == newest_first[:2]
        rest = store.lookup_key_page("victim", "order-7", 2, page.next)
        assert [m.phys_offset for m in rest.messages] == newest_first[2:] and rest.next is None
