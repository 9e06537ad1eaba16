"""Hypothesis against what clients hand the transactional and lite-topic paths: transaction
ids and lite receipt handles parse or are refused with the documented error, never another
exception."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidReceiptHandle, TransactionNotFound
from core.lite_receive import HANDLE_PREFIX, parse_lite_handle
from core.transactions import parse_transaction_id, transaction_id

pieces = st.lists(st.sampled_from(["L", "|", "0", "12", "ff", "-1", ":", "٣", "s1", "", " "]),
                  max_size=12).map("".join)


@settings(max_examples=500, deadline=None)
@given(value=st.one_of(pieces, st.text(max_size=300)))
def test_transaction_ids_parse_or_are_refused(value):
    try:
        offset, msg_id = parse_transaction_id(value)
    except TransactionNotFound:
        return
    assert offset >= 0 and transaction_id(offset, msg_id) == value


@settings(max_examples=500, deadline=None)
@given(handle=st.one_of(pieces, st.text(max_size=300), pieces.map(lambda p: HANDLE_PREFIX + p)))
def test_lite_receipt_handles_parse_or_are_refused(handle):
    try:
        parsed = parse_lite_handle(handle)
    except InvalidReceiptHandle:
        return
    assert handle.startswith(HANDLE_PREFIX) and handle.endswith("|" + parsed.lite_topic)
