"""Every adapter answers a core error through one table resolved along the class hierarchy, so a
subclass the table does not list (BadFilter, OffsetOutOfRange, a future one) maps like its base."""

from __future__ import annotations

import pytest
from rocketmq.grpc_protocol.definition_pb2 import Code

from core import errors
from protocols.admin.errors import status_for
from protocols.amqp.errors import reply_code
from protocols.mqtt.errors import reason_for
from protocols.mqtt.reason_codes import ReasonCode
from protocols.native.errors import code_of


class NewKindOfMissingTopic(errors.TopicNotFound):
    """A subclass no table lists."""


def test_nearest_prefers_the_class_then_its_bases() -> None:
    table = {errors.InvalidArgument: "bad", errors.SluiceError: "other"}
    assert errors.nearest(table, errors.BadFilter("x")) == "bad"
    assert errors.nearest(table, errors.TopicNotFound("t")) == "other"
    assert errors.nearest(table, ValueError("x")) is None


@pytest.mark.parametrize("error, reason", [
    (errors.BadFilter("a/#/b"), ReasonCode.TopicNameInvalid),
    (errors.OffsetOutOfRange("9"), ReasonCode.TopicNameInvalid),
    (errors.AccessDenied("no"), ReasonCode.NotAuthorized),
    (errors.QuotaExceeded("full"), ReasonCode.QuotaExceeded),
    (RuntimeError("bug"), ReasonCode.ImplementationSpecificError),
])
def test_mqtt_reason_codes_follow_the_class_hierarchy(error, reason) -> None:
    assert reason_for(error) == reason


def test_native_and_admin_codes_follow_the_class_hierarchy() -> None:
    missing = NewKindOfMissingTopic("t")
    assert code_of(missing) == Code.TOPIC_NOT_FOUND
    assert status_for(missing) == (404, "topic_not_found")
    assert code_of(errors.OffsetOutOfRange("9")) == Code.ILLEGAL_OFFSET
    assert status_for(RuntimeError("bug")) == (500, "internal")


def test_a_corrupt_message_is_an_internal_error_with_its_message() -> None:
    corrupt = errors.CorruptMessage("orders", 0, 1, "CRC32C mismatch")
    assert code_of(corrupt) == Code.INTERNAL_ERROR
    assert status_for(corrupt) == (500, "internal")
    assert reason_for(corrupt) == ReasonCode.ImplementationSpecificError


@pytest.mark.parametrize("error, text", [
    (errors.TopicNotFound("orders"), "topic 'orders' does not exist; create it first "
                                     "(`sluice topic create orders`) or check the name"),
    (errors.GroupNotFound("g1"), "consumer group 'g1' does not exist; create it (`sluice group "
                                 "create g1`) or let a consumer's heartbeat create it"),
])
def test_not_found_errors_are_built_from_a_name_and_read_as_one_sentence(error, text) -> None:
    assert str(error) == text


@pytest.mark.parametrize("error, code, hard", [
    (errors.PreconditionFailed("x"), 406, False),
    (errors.ResourceLocked("x"), 405, False),
    (NewKindOfMissingTopic("t"), 404, False),      # an unlisted subclass maps like NotFound
    (errors.BadFilter("x"), 406, False),
    (errors.NotSupported("x"), 540, True),
    (errors.QuotaExceeded("full"), 506, True),
    (RuntimeError("bug"), 541, True),
])
def test_amqp_reply_codes_follow_the_class_hierarchy(error, code, hard):
    assert reply_code(error) == code and reply_code(error).hard == hard
