"""Object names: Hive escaping of topics that pyarrow undoes, deterministic keys, and the keys
the tierer recognises as its own."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from hypothesis import given, strategies as st

from store.tier import layout


@given(st.text(min_size=1, max_size=30))
def test_escape_round_trips_and_keeps_keys_plain(topic: str) -> None:
    escaped = layout.escape(topic)
    assert layout.unescape(escaped) == topic
    assert set(escaped) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-%")


def test_pyarrow_reads_the_topic_back_from_the_path(tmp_path: Path) -> None:
    topics = ["plain", "a/b", "100%", "with space", "ünïcode", "a=b&c"]
    for number, topic in enumerate(topics):
        path = tmp_path / layout.data_key(topic, "2026-03-04", number)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"n": [number]}), path)
    table = ds.dataset(tmp_path / "data", format="parquet", partitioning="hive").to_table()
    assert sorted(zip(table["n"].to_pylist(), table["topic"].to_pylist())) == list(enumerate(topics))
    assert set(table["day"].to_pylist()) == {"2026-03-04"}


def test_keys() -> None:
    assert layout.data_key("a/b", "2026-01-02", 4096) == "data/topic=a%2Fb/day=2026-01-02/00000000000000004096.parquet"
    assert layout.index_key(4096) == "index/00000000000000004096.parquet"
    assert layout.manifest_key(7) == "manifest/00000000000000000007.json"
    assert layout.manifest_version(layout.manifest_key(7)) == 7 and layout.manifest_version("manifest/x.json") is None
    assert layout.segment_of(layout.data_key("a/b", "2026-01-02", 4096)) == 4096
    assert layout.segment_of(layout.index_key(5)) == 5
    assert layout.segment_of("data/elsewhere/00000000000000000005.parquet") is None
    assert layout.day_of(0) == "1970-01-01" and layout.day_of(86_400_000 - 1) == "1970-01-01"
