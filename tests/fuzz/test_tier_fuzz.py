"""Hypothesis against the tier reader: tiered objects are untrusted (anyone with write access to
the bucket can change them). A damaged or hostile data or key-index file gives StoreError-family
errors (TierDataError, CorruptRecordError, ObjectStoreError), never another exception and never
a record other than the one the log held: every record read back is checked against the log.
"""
from __future__ import annotations

import io
import tempfile

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.api import StoreConfig
from store.errors import StoreError
from store.file_store import FileStore
from store.tier.objects import LocalDirectory
from store.tier.reader import TierReader
from tests.unit.store.tier.build import row_groups, segment_records, tier_segments
from tests.unit.store.tier.conftest import fill

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def original():
    """A tier of two segments, every object's bytes, and what the log held."""
    with tempfile.TemporaryDirectory() as directory:
        store = FileStore(directory + "/data", StoreConfig(segment_size=4096))
        try:
            fill(store, 120)
            objects = LocalDirectory(directory + "/tier")
            with row_groups(4):
                manifest = tier_segments(store, objects, 2)
            records = {m.phys_offset: m for s in store.log.segments()[:2] for m in segment_records(store, s)}
            blobs = {info.key: objects.get(info.key) for info in objects.list("")}
        finally:
            store.close()
    positions = {}
    for message in records.values():
        for target in ((message.topic, message.queue_id, message.queue_offset), *message.dispatch):
            positions[target] = message.encode()
    return manifest, blobs, {offset: m.encode() for offset, m in records.items()}, positions, records


def check_everything(original, blobs: dict[str, bytes]) -> None:
    """Every read of the tier in ``blobs`` gives the log's record or a StoreError."""
    manifest, _, by_offset, by_position, records = original
    with tempfile.TemporaryDirectory() as directory:
        objects = LocalDirectory(directory)
        for key, data in blobs.items():
            objects.put(key, data)
        reader = TierReader(objects, cache_bytes=1 << 20)
        reader.set_manifest(manifest)
        for (topic, queue, offset) in sorted(by_position):
            for count in (1, 50):
                try:
                    got = reader.read(topic, queue, offset, count, 1 << 20)
                except StoreError:
                    continue
                for n, message in enumerate(got):
                    assert message.encode() == by_position[topic, queue, offset + n]
        for offset in by_offset:
            try:
                assert reader.read_at(offset).encode() == by_offset[offset]
            except (KeyError, StoreError):
                pass
        for message in list(records.values())[::7]:
            for call in (lambda: reader.lookup_id(message.msg_id, [message.topic], 4),
                         *(lambda key=key: reader.lookup_key(message.topic, key, 4) for key in message.keys)):
                try:
                    found = call()
                except StoreError:
                    continue
                assert all(m.encode() == by_offset[m.phys_offset] for m in found)
            try:
                reader.offset_for_time(message.topic, message.queue_id, message.store_ts)
            except StoreError:
                pass


mutation = st.one_of(
    st.tuples(st.just("flip"), st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)),
                                        min_size=1, max_size=4)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 20)),
    st.tuples(st.just("splice"), st.tuples(st.integers(0, 1 << 20), st.binary(min_size=1, max_size=64))),
)


def mutate(data: bytes, how) -> bytes:
    kind, what = how
    if kind == "flip":
        out = bytearray(data)
        for position, mask in what:
            out[position % len(out)] ^= mask
        return bytes(out)
    if kind == "truncate":
        return data[:what % len(data)]
    position, junk = what
    position %= len(data)
    return data[:position] + junk + data[position + len(junk):]


@FUZZ
@given(which=st.integers(0, 1 << 16), how=mutation)
def test_damaged_objects_give_store_errors_or_the_right_records(original, which, how):
    blobs = dict(original[1])
    keys = sorted(key for key in blobs if key.endswith(".parquet"))
    key = keys[which % len(keys)]
    blobs[key] = mutate(blobs[key], how)
    check_everything(original, blobs)


def parquet(table: pa.Table, row_group_size: int) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", row_group_size=row_group_size, write_page_checksum=True)
    return sink.getvalue()


def _hostile_tables(table: pa.Table, draw) -> pa.Table:
    """A structurally hostile version of a data or index table."""
    kind = draw(st.sampled_from(["null", "drop", "retype", "reverse", "duplicate", "size", "batch", "swap"]))
    names = table.column_names
    name = draw(st.sampled_from(names))
    row = draw(st.integers(0, max(0, table.num_rows - 1)))
    if kind == "null":
        column = table.column(name).combine_chunks()
        mask = pa.array([i == row for i in range(table.num_rows)])
        return table.set_column(names.index(name), name, pc.if_else(mask, pa.nulls(table.num_rows, column.type), column))
    if kind == "drop":
        return table.drop_columns([name])
    if kind == "retype":
        return table.set_column(names.index(name), name, pa.array([str(i) for i in range(table.num_rows)]))
    if kind == "reverse":
        return table.take(pa.array(range(table.num_rows - 1, -1, -1)))
    if kind == "duplicate":
        return pa.concat_tables([table.slice(0, row + 1), table.slice(row)])
    if kind in ("size", "batch", "swap"):
        target = {"size": "log_size", "batch": "batch_index", "swap": "offset"}[kind]
        if target not in names:
            return table
        values = table.column(target).to_pylist()
        if kind == "swap" and len(values) > 1:
            other = (row + 1) % len(values)
            values[row], values[other] = values[other], values[row]
        else:
            values[row] = (values[row] or 0) + draw(st.integers(1, 3))
        return table.set_column(names.index(target), target, pa.array(values, table.schema.field(target).type))
    return table


@FUZZ
@given(which=st.integers(0, 1 << 16), data=st.data())
def test_hostile_tables_give_store_errors_or_the_right_records(original, which, data):
    blobs = dict(original[1])
    keys = sorted(key for key in blobs if key.endswith(".parquet"))
    key = keys[which % len(keys)]
    table = pq.read_table(io.BytesIO(blobs[key]))
    if table.num_rows:
        blobs[key] = parquet(_hostile_tables(table, data.draw), row_group_size=data.draw(st.integers(1, 50)))
    check_everything(original, blobs)
