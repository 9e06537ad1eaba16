"""Login floods cost the broker bounded work, counted rather than timed: no key derivation on
the event loop, none for a banned peer, failures answered late and counted per address, per
(address, user name) and per user name, a correct login from another address never kept
waiting, and the throttle's memory bounded."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest

from core.assembly import Core
from core.errors import LoginBusy, LoginThrottled, Unauthenticated
from core.login_checks import MAX_PENDING_PER_PEER, THREAD_NAME, CheckPool
from core.login_throttle import LoginLimits, LoginThrottle, peer_address
from core.logins import Logins
from core.metadata import passwords
from core.model import Principal
from core.settings import CoreConfig
from tests.unit.core.test_broker import CONFIG, run_core

ANN = Principal("ann")


class Clock:
    """Time the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Delays:
    """``sleep`` that records each delay asked for and returns at once."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)


class Kdf:
    """Counts scrypt computations and the threads they ran on."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.on_loop = 0
        self.loop_thread: int | None = None

    @property
    def runs(self) -> int:
        return len(self.threads)

    def record(self) -> None:
        self.threads.append(threading.current_thread().name)
        if threading.get_ident() == self.loop_thread:
            self.on_loop += 1


@contextmanager
def counting_kdf(monkeypatch) -> Iterator[Kdf]:
    """Every scrypt the broker computes, counted, with the thread it ran on."""
    passwords._decoy()  # the decoy hash unknown users are checked against, made beforehand
    kdf = Kdf()
    kdf.loop_thread = threading.get_ident()
    real = passwords._scrypt

    def scrypt(*args, **kwargs):
        kdf.record()
        return real(*args, **kwargs)

    monkeypatch.setattr(passwords, "_scrypt", scrypt)
    yield kdf


def quick(**limits: int) -> CoreConfig:
    """The test core's settings with ``login_*`` limits."""
    return replace(CONFIG, **{f"login_{k}": v for k, v in limits.items()})


async def refused(login) -> Unauthenticated:
    with pytest.raises(Unauthenticated) as caught:
        await login
    return caught.value


# --- no key derivation on the event loop ---

def test_the_event_loop_never_runs_scrypt_and_unknown_users_cost_what_known_ones_do(
        tmp_path, monkeypatch):
    async def scenario(core: Core) -> None:
        broker = core.broker
        broker.users.create_user("ann", "right")
        with counting_kdf(monkeypatch) as kdf:
            assert (await broker.authenticate("ann", "right", "10.0.0.1")).user == "ann"
            assert kdf.runs == 1, "the first check of a password costs one scrypt"
            for _ in range(3):
                assert (await broker.authenticate("ann", "right", "10.0.0.1")).user == "ann"
            assert kdf.runs == 1, "a password verified before is recognised without one"
            for user in ("ann", "ann", "nobody", "nobody", "x" * 60_000):
                await refused(broker.authenticate(user, "wrong", "10.0.0.2"))
            assert kdf.runs == 6, "a wrong password costs one scrypt, for a known user as " \
                                  "for an unknown one"
        assert kdf.on_loop == 0
        assert all(name.startswith(THREAD_NAME) for name in kdf.threads)

    run_core(tmp_path, scenario, config=quick(failure_delay_ms=0))


def test_after_n_failures_an_address_costs_no_scrypt_and_another_address_gets_in(
        tmp_path, monkeypatch):
    async def scenario(core: Core) -> None:
        broker = core.broker
        broker.users.create_user("ann", "right")
        with counting_kdf(monkeypatch) as kdf:
            for _ in range(4):
                await refused(broker.authenticate("ann", "guess", "127.0.0.1"))
            assert kdf.runs == 4
            for password in ("guess", "right", "other"):
                assert isinstance(await refused(broker.authenticate("ann", password, "127.0.0.1")),
                                  LoginThrottled)
            assert kdf.runs == 4, "refused without a scrypt"
            assert (await broker.authenticate("ann", "right", "127.0.0.2")).user == "ann"
            assert kdf.runs == 5 and kdf.on_loop == 0

    run_core(tmp_path, scenario, config=quick(failure_delay_ms=0, max_failures_per_peer_user=4))


def test_a_fleet_sharing_credentials_logging_in_at_once_costs_one_scrypt(tmp_path, monkeypatch):
    """A reconnect storm from one gateway: more logins at once than an address may have checks
    waiting, all with one user and password, share one check and all get in; a wrong password
    among them is checked on its own."""
    async def scenario(core: Core) -> None:
        broker = core.broker
        broker.users.create_user("fleet", "shared")
        with counting_kdf(monkeypatch) as kdf:
            storm = [broker.authenticate("fleet", "shared", "10.0.0.9")
                     for _ in range(3 * MAX_PENDING_PER_PEER)]
            wrong = broker.authenticate("fleet", "guess", "10.0.0.9")
            *principals, failure = await asyncio.gather(*storm, wrong, return_exceptions=True)
            assert [p.user for p in principals] == ["fleet"] * len(storm)
            assert isinstance(failure, Unauthenticated) and not isinstance(failure, LoginBusy)
            assert kdf.runs == 2 and kdf.on_loop == 0

    run_core(tmp_path, scenario, config=quick(failure_delay_ms=0))


def test_a_wrong_signature_costs_the_same_for_known_and_unknown_access_keys(tmp_path):
    async def scenario(core: Core) -> None:
        broker, users = core.broker, core.broker.users
        users.create_user("ann", "right")
        lookups: list[str] = []
        real = users._repository.signing_secret
        users._repository.signing_secret = lambda name: (lookups.append(name), real(name))[1]
        for _ in range(3):
            for key in ("ann", "nobody"):
                await refused(broker.authenticate_signature(key, b"20240517T101500Z", "00",
                                                            "10.0.0.3"))
        assert sorted(lookups) == ["ann", "nobody"], \
            "each key is looked up once; later checks, of either, cost one HMAC in memory"

    run_core(tmp_path, scenario, config=quick(failure_delay_ms=0))


# --- the throttle ---

def throttled(clock: Clock, **limits: int) -> tuple[Logins, Delays]:
    delays = Delays()
    logins = Logins(quick(**limits), clock=clock, sleep=delays)
    return logins, delays


class Checks:
    """A costly check that counts its runs: right for ``password``, Unauthenticated otherwise."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, user: str, password: str) -> Callable[[], Principal]:
        def check() -> Principal:
            self.runs += 1
            if password != "right":
                raise Unauthenticated("wrong")
            return Principal(user)
        return check


def log_in(logins: Logins, checks: Checks, peer: str, user: str, password: str):
    return logins.decide(peer, user, lambda: None, checks(user, password))


def test_failures_are_answered_late_then_the_pair_is_refused_without_a_check():
    async def scenario() -> None:
        clock = Clock()
        logins, delays = throttled(clock, failure_delay_ms=1_000, max_failures_per_peer_user=5,
                                   ban_ms=60_000)
        checks = Checks()
        for _ in range(5):
            assert type(await refused(log_in(logins, checks, "10.0.0.1", "ann", "guess"))) \
                is Unauthenticated
        assert checks.runs == 5 and delays.asked == [1.0] * 5
        for password in ("guess", "right"):
            banned = await refused(log_in(logins, checks, "10.0.0.1", "ann", password))
            assert isinstance(banned, LoginThrottled) and banned.retry_after_s == 60
            assert "too many failed logins for user 'ann' from address 10.0.0.1" in str(banned)
        assert checks.runs == 5, "a banned pair gets no check, even with the right password"
        assert delays.asked == [1.0] * 5, "and its refusals wait for nothing"
        assert await log_in(logins, checks, "10.0.0.1", "bob", "right") == Principal("bob"), \
            "the address may still log in as another user"
        clock.now += 60
        assert await log_in(logins, checks, "10.0.0.1", "ann", "right") == ANN, "the ban ends"

    asyncio.run(scenario())


def test_an_address_failing_for_many_user_names_is_refused_for_all_of_them():
    async def scenario() -> None:
        clock = Clock()
        logins, _ = throttled(clock, max_failures_per_peer=8, ban_ms=30_000)
        checks = Checks()
        for n in range(8):
            await refused(log_in(logins, checks, "10.0.0.1", f"user-{n}", "guess"))
        banned = await refused(log_in(logins, checks, "10.0.0.1", "ann", "right"))
        assert isinstance(banned, LoginThrottled) and "for address 10.0.0.1" in str(banned)
        assert checks.runs == 8

    asyncio.run(scenario())


def test_counts_decay_when_their_window_ends():
    async def scenario() -> None:
        clock = Clock()
        logins, _ = throttled(clock, max_failures_per_peer_user=5, failure_window_ms=10_000)
        checks = Checks()
        for _ in range(3):
            for _ in range(4):
                await refused(log_in(logins, checks, "10.0.0.1", "ann", "guess"))
            clock.now += 10
        assert checks.runs == 12, "four failures a window never reach a limit of five"
        assert await log_in(logins, checks, "10.0.0.1", "ann", "right") == ANN

    asyncio.run(scenario())


def test_a_correct_login_from_another_address_is_accepted_while_one_is_banned():
    async def scenario() -> None:
        logins, _ = throttled(Clock(), max_failures_per_peer=5, max_failures_per_peer_user=3)
        checks = Checks()
        for _ in range(5):
            await refused(log_in(logins, checks, "127.0.0.1", "ann", "guess"))
        assert isinstance(await refused(log_in(logins, checks, "127.0.0.1", "ann", "right")),
                          LoginThrottled)
        runs = checks.runs
        assert await log_in(logins, checks, "127.0.0.2", "ann", "right") == ANN
        assert checks.runs == runs + 1

    asyncio.run(scenario())


def test_a_user_names_limit_refuses_failing_addresses_but_never_a_clean_one():
    async def scenario() -> None:
        logins, _ = throttled(Clock(), max_failures_per_user=20, max_failures_per_peer_user=100)
        checks = Checks()
        for n in range(20):  # a guesser spread over twenty addresses
            await refused(log_in(logins, checks, f"10.1.0.{n}", "ann", "guess"))
        assert checks.runs == 20
        again = await refused(log_in(logins, checks, "10.1.0.3", "ann", "guess"))
        assert isinstance(again, LoginThrottled) and "from several addresses" in str(again)
        assert checks.runs == 20, "an address that failed gets no more checks for this user"
        assert await log_in(logins, checks, "10.2.0.1", "ann", "right") == ANN, \
            "the real user, from an address without failures, is checked and let in"
        assert await log_in(logins, checks, "10.1.0.3", "bob", "right") == Principal("bob")

    asyncio.run(scenario())


def test_the_cache_of_successful_logins_is_not_an_oracle_for_a_banned_address():
    async def scenario() -> None:
        logins, _ = throttled(Clock(), max_failures_per_peer=3)
        cheap_runs = 0

        def cheap() -> Principal | None:
            nonlocal cheap_runs
            cheap_runs += 1
            return None

        def costly() -> Principal:
            raise Unauthenticated("wrong")

        for _ in range(3):
            await refused(logins.decide("10.0.0.1", "ann", cheap, costly))
        assert cheap_runs == 3
        await refused(logins.decide("10.0.0.1", "ann", lambda: ANN, costly))
        assert cheap_runs == 3, "a banned address is refused before any comparison"

    asyncio.run(scenario())


def test_the_throttle_holds_at_most_its_budget_whatever_the_number_of_addresses():
    throttle = LoginThrottle(LoginLimits(memory_bytes=64 << 10), Clock())
    for n in range(20_000):
        attempt = throttle.admit(f"10.{n >> 16}.{(n >> 8) & 255}.{n & 255}", f"user-{n}" * 50)
        throttle.failed(attempt)
    assert throttle.held_bytes <= 64 << 10


@pytest.mark.parametrize("host, counted_as", [
    ("127.0.0.2", "127.0.0.2"),
    ("::ffff:10.0.0.1", "10.0.0.1"),
    ("[2001:db8:1:2:3:4:5:6]", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
    ("", "unknown"),
    ("/run/sluice.sock" * 10, ("/run/sluice.sock" * 10)[:64]),
])
def test_addresses_are_counted_by_host_and_ipv6_by_its_64(host, counted_as):
    assert peer_address(host) == counted_as


# --- the check threads ---

class Gate:
    """Checks that record their order; the first waits until the test opens the gate."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.opened = threading.Event()
        self.started = threading.Event()

    def check(self, name: str, blocking: bool = False) -> Callable[[], str]:
        def run() -> str:
            if blocking:
                self.started.set()
                self.opened.wait(30)
            self.order.append(name)
            return name
        return run


def test_a_clean_address_is_served_before_the_queued_checks_of_a_failing_one():
    async def scenario() -> None:
        pool, gate = CheckPool(threads=1), Gate()
        busy = asyncio.ensure_future(pool.run("10.0.0.1", True, gate.check("busy", True)))
        await asyncio.to_thread(gate.started.wait, 30)
        flood = [asyncio.ensure_future(pool.run("10.0.0.1", True, gate.check(f"flood-{n}")))
                 for n in range(6)]
        await asyncio.sleep(0)
        assert pool.waiting == 6
        real = asyncio.ensure_future(pool.run("10.0.0.2", False, gate.check("real")))
        await asyncio.sleep(0)
        gate.opened.set()
        assert await real == "real"
        await asyncio.gather(busy, *flood)
        assert gate.order[:2] == ["busy", "real"], "the clean address waits for no queued check"
        pool.close()

    asyncio.run(scenario())


def test_waiting_checks_take_turns_across_addresses():
    async def scenario() -> None:
        pool, gate = CheckPool(threads=1), Gate()
        busy = asyncio.ensure_future(pool.run("10.0.0.9", False, gate.check("busy", True)))
        await asyncio.to_thread(gate.started.wait, 30)
        first = [asyncio.ensure_future(pool.run("10.0.0.1", False, gate.check(f"a{n}")))
                 for n in range(4)]
        await asyncio.sleep(0)
        second = asyncio.ensure_future(pool.run("10.0.0.2", False, gate.check("b0")))
        await asyncio.sleep(0)
        gate.opened.set()
        await asyncio.gather(busy, second, *first)
        assert gate.order == ["busy", "a0", "b0", "a1", "a2", "a3"]
        pool.close()

    asyncio.run(scenario())


def test_an_address_with_too_many_checks_pending_is_refused_without_one():
    async def scenario() -> None:
        pool, gate = CheckPool(threads=1, max_pending=100), Gate()
        pending = [asyncio.ensure_future(pool.run("10.0.0.1", False,
                                                  gate.check(f"c{n}", n == 0)))
                   for n in range(MAX_PENDING_PER_PEER)]
        await asyncio.to_thread(gate.started.wait, 30)
        with pytest.raises(LoginBusy, match=f"10.0.0.1 has {MAX_PENDING_PER_PEER} logins being checked"):
            await pool.run("10.0.0.1", False, gate.check("one too many"))
        other = asyncio.ensure_future(pool.run("10.0.0.2", False, gate.check("other")))
        gate.opened.set()
        assert await other == "other"
        await asyncio.gather(*pending)
        assert "one too many" not in gate.order and pool.served == MAX_PENDING_PER_PEER + 1
        pool.close()

    asyncio.run(scenario())


def test_a_full_queue_refuses_at_once_and_a_cancelled_wait_gives_its_place_back():
    async def scenario() -> None:
        pool, gate = CheckPool(threads=1, max_pending=2), Gate()
        busy = asyncio.ensure_future(pool.run("10.0.0.1", False, gate.check("busy", True)))
        await asyncio.to_thread(gate.started.wait, 30)
        waiting = [asyncio.ensure_future(pool.run(f"10.0.1.{n}", False, gate.check(f"w{n}")))
                   for n in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(LoginBusy, match="too many logins"):
            await pool.run("10.0.2.1", False, gate.check("refused"))
        waiting[0].cancel()  # its connection closed while it waited
        await asyncio.sleep(0)
        assert pool.waiting == 1
        late = asyncio.ensure_future(pool.run("10.0.2.1", False, gate.check("late")))
        gate.opened.set()
        assert await late == "late" and await waiting[1] == "w1"
        await busy
        assert gate.order == ["busy", "w1", "late"]
        pool.close()

    asyncio.run(scenario())


def test_a_check_whose_caller_left_keeps_its_thread_until_it_ends():
    async def scenario() -> None:
        pool, gate = CheckPool(threads=1), Gate()
        left = asyncio.ensure_future(pool.run("10.0.0.1", False, gate.check("left", True)))
        await asyncio.to_thread(gate.started.wait, 30)
        left.cancel()  # the client hung up; scrypt goes on on its thread
        await asyncio.sleep(0)
        after = asyncio.ensure_future(pool.run("10.0.0.2", False, gate.check("after")))
        await asyncio.sleep(0)
        assert pool.waiting == 1, "no second check runs beside it: the bound holds"
        gate.opened.set()
        assert await after == "after" and gate.order == ["left", "after"]
        pool.close()

    asyncio.run(scenario())
