"""A connection's publish batches overlap their waits for disk, in order, bounded."""

from __future__ import annotations

import asyncio

from protocols.amqp.publish_pipeline import PublishPipeline


async def turns(count: int = 10) -> None:
    """Let the loop run ``count`` iterations: every ready callback and task step runs (nothing
    here waits on I/O or time)."""
    for _ in range(count):
        await asyncio.sleep(0)


async def stored(done: asyncio.Event, log: list[str], name: str) -> None:
    log.append(f"{name} appended")
    await done.wait()
    log.append(f"{name} confirmed")


def test_the_next_batch_is_stored_while_the_previous_one_waits_and_drain_waits_for_both():
    asyncio.run(_overlap())


async def _overlap() -> None:
    pipeline, log = PublishPipeline(limit=100, on_failure=_unexpected), []
    first, second = asyncio.Event(), asyncio.Event()
    await asyncio.wait_for(pipeline.submit(stored(first, log, "a"), 10), 1)
    await asyncio.wait_for(pipeline.submit(stored(second, log, "b"), 10), 1)
    await asyncio.sleep(0)
    assert log == ["a appended", "b appended"]
    drained = asyncio.ensure_future(pipeline.drain())
    first.set()
    await turns()
    assert not drained.done()
    second.set()
    await asyncio.wait_for(drained, 1)
    assert log == ["a appended", "b appended", "a confirmed", "b confirmed"]


def test_beyond_the_limit_the_reader_waits_for_the_oldest_batch():
    asyncio.run(_limit())


async def _limit() -> None:
    pipeline, log = PublishPipeline(limit=15, on_failure=_unexpected), []
    first, second = asyncio.Event(), asyncio.Event()
    await pipeline.submit(stored(first, log, "a"), 10)
    submitting = asyncio.ensure_future(pipeline.submit(stored(second, log, "b"), 10))
    await turns()
    assert not submitting.done()
    first.set()
    await asyncio.wait_for(submitting, 1)
    second.set()
    await asyncio.wait_for(pipeline.drain(), 1)


def test_a_failing_batch_is_logged_reported_and_the_others_go_on(caplog):
    failures = asyncio.run(_failing())
    assert "storing AMQP publishes failed" in caplog.text
    assert [str(error) for error in failures] == ["boom"]


async def _failing() -> list[BaseException]:
    failures: list[BaseException] = []
    pipeline = PublishPipeline(limit=100, on_failure=failures.append)

    async def failing() -> None:
        raise RuntimeError("boom")

    await pipeline.submit(failing(), 1)
    await pipeline.submit(asyncio.sleep(0), 1)
    await asyncio.wait_for(pipeline.drain(), 1)
    return failures


def _unexpected(error: BaseException) -> None:
    raise AssertionError(f"no batch should fail here: {error!r}")
