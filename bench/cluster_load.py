"""A replica group of real `sluice serve` processes under confirmed load: the failover tests' and
the SIGKILL loop's harness.

``Load`` runs one producer per protocol in threads of this process, each through every node in
turn (the way a user's clients carry on: paho reconnecting to the next host, pika given every
node's URL, the SDK given every endpoint), and records each message the broker confirmed
(PUBACK, AMQP confirm, SendMessage OK). ``logged_ids`` is the independent counter: it reads the
message ids straight out of a stopped node's commit-log files, bypassing the broker.
"""
from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from collections import Counter

import paho.mqtt.client as mqtt
import pika
from pika.adapters.utils.connection_workflow import AMQPConnectorException

from sluice.cli.dev_cluster import DevCluster, NodeProcess
from sluice.client import ClientConfig, Message, SluiceClientError, SyncProducer

USER = PASSWORD = "sluice"
WAIT_S = 120.0
"""Guards against hanging only; nothing here depends on how fast the machine is."""
ID = re.compile(rb"(mqtt|amqp|native)-(\d{7})(?!\d)")


def cluster_view(group: DevCluster, skip: tuple[NodeProcess, ...] = ()) -> dict | None:
    """``GET /cluster`` from the first node that answers (None if none does)."""
    for node in group.nodes:
        if node in skip or not node.alive:
            continue
        try:
            with urllib.request.urlopen(f"http://{node.host}:{group.ports.admin}/cluster", timeout=5) as reply:
                return json.load(reply)
        except OSError:
            continue
    return None


def wait_for(what: str, check, timeout_s: float = WAIT_S, every_s: float = 0.2):
    """Poll ``check()`` until it returns something true (the cluster's state in etcd offers no
    event to a test outside it); fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every_s)


def leader_of(group: DevCluster, skip: tuple[NodeProcess, ...] = ()) -> NodeProcess:
    """The node that leads with its broker serving, waiting for one (its stdout says so)."""
    def leading() -> NodeProcess | None:
        view = cluster_view(group, skip)
        if view is None or view["leader"] is None:
            return None
        node = group.node(view["leader"])
        return node if node.leading.is_set() and node.alive and node not in skip else None
    return wait_for("a leader serving clients", leading)


def in_sync(group: DevCluster, names: set[str]) -> dict:
    return wait_for(f"in-sync set {sorted(names)}",
                    lambda: (view := cluster_view(group)) and set(view["isr"]) == names and view)


class Producer(threading.Thread):
    """Sends numbered messages until stopped, recording which the broker confirmed."""

    protocol = ""

    def __init__(self, group: DevCluster) -> None:
        super().__init__(daemon=True, name=f"{self.protocol}-producer")
        self.group = group
        self.hosts = [node.host for node in group.nodes]
        self.confirmed: list[int] = []
        self.sent_at = 0.0
        self.confirm_times: list[tuple[float, float]] = []
        """(when its send began, when it was confirmed) of each confirmed message, in order."""
        self.failures = 0
        self.last_failure = ""
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)

    def body(self, number: int) -> bytes:
        return f"{self.protocol}-{number:07d}".encode()

    def failed(self, error: BaseException) -> None:
        """A send or connection failed: not confirmed; the producer goes on."""
        self.failures += 1
        self.last_failure = repr(error)

    def sending(self) -> None:
        """A send of a new message begins now."""
        self.sent_at = time.monotonic()

    def confirm(self, number: int) -> None:
        with self._progress:
            self.confirmed.append(number)
            self.confirm_times.append((self.sent_at, time.monotonic()))
            self._progress.notify_all()

    def first_confirm_after(self, moment: float, timeout_s: float = WAIT_S) -> float:
        """When the first message whose send began after ``moment`` (monotonic) was confirmed."""
        with self._progress:
            if not self._progress.wait_for(lambda: (self.confirm_times and self.confirm_times[-1][0] > moment)
                                           or self.error is not None, timeout_s):
                raise AssertionError(f"{self.protocol}: nothing confirmed within {timeout_s:.0f} s "
                                     f"(last failure: {self.last_failure})")
            if self.error is not None:
                raise AssertionError(f"{self.protocol} producer failed") from self.error
            return min(confirmed for sent, confirmed in self.confirm_times if sent > moment)

    def count(self) -> int:
        with self._lock:
            return len(self.confirmed)

    def wait_confirmed(self, count: int, timeout_s: float = WAIT_S) -> None:
        with self._progress:
            if not self._progress.wait_for(lambda: len(self.confirmed) >= count or self.error is not None, timeout_s):
                raise AssertionError(f"{self.protocol}: {len(self.confirmed)} of {count} confirmed in time "
                                     f"({self.failures} failed attempts, the last: {self.last_failure})")
        if self.error is not None:
            raise AssertionError(f"{self.protocol} producer failed") from self.error

    def run(self) -> None:
        try:
            self.produce()
        except BaseException as error:  # noqa: BLE001 - reported by wait_confirmed
            self.error = error
            with self._progress:
                self._progress.notify_all()

    def produce(self) -> None:
        raise NotImplementedError


class MqttProducer(Producer):
    protocol = "mqtt"

    def produce(self) -> None:
        number, turn = 0, 0
        while not self.stopping.is_set():
            host = self.hosts[turn % len(self.hosts)]
            turn += 1
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
            client.username_pw_set(USER, PASSWORD)
            try:
                client.connect(host, self.group.ports.mqtt, keepalive=10)
            except OSError as error:
                self.failed(error)
                continue
            client.loop_start()
            try:
                while not self.stopping.is_set():
                    number += 1
                    self.sending()
                    info = client.publish("load/mqtt", self.body(number), qos=1)
                    info.wait_for_publish(10)
                    if not info.is_published():
                        self.failed(TimeoutError("no PUBACK within 10 s"))
                        break
                    self.confirm(number)
            except (RuntimeError, ValueError, OSError) as error:  # paho: the connection is gone
                self.failed(error)
            finally:
                client.disconnect()
                client.loop_stop()


class AmqpProducer(Producer):
    protocol = "amqp"
    QUEUE = "load-amqp"

    def produce(self) -> None:
        number = 0
        credentials = pika.PlainCredentials(USER, PASSWORD)
        nodes = [pika.ConnectionParameters(host, self.group.ports.amqp, credentials=credentials,
                                           connection_attempts=1, socket_timeout=5, blocked_connection_timeout=10,
                                           heartbeat=4)  # notice a node that stopped answering
                 for host in self.hosts]
        turn = 0
        while not self.stopping.is_set():
            turn += 1
            try:  # pika tries each node's URL in turn; start with the next one each time
                connection = pika.BlockingConnection(nodes[turn % len(nodes):] + nodes[:turn % len(nodes)])
            except (pika.exceptions.AMQPError, AMQPConnectorException, OSError) as error:  # the last of which
                # pika re-raises as it is: a handshake timing out (a frozen leader behind a relay)
                self.failed(error)
                continue
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                channel.queue_declare(self.QUEUE, durable=True)
                while not self.stopping.is_set():
                    number += 1
                    self.sending()
                    channel.basic_publish("", self.QUEUE, self.body(number),
                                          pika.BasicProperties(delivery_mode=2), mandatory=True)
                    self.confirm(number)
            except (pika.exceptions.AMQPError, OSError) as error:
                self.failed(error)
            finally:
                if connection.is_open:
                    try:
                        connection.close()
                    except (pika.exceptions.AMQPError, OSError):
                        pass


class NativeProducer(Producer):
    protocol = "native"

    def produce(self) -> None:
        number = 0
        endpoints = ",".join(f"{host}:{self.group.ports.native}" for host in self.hosts)
        config = ClientConfig(endpoints, USER, PASSWORD, request_timeout=10, reconnect_timeout=60)
        while not self.stopping.is_set():
            producer = SyncProducer(config)
            try:
                producer.start()
            except SluiceClientError as error:  # no node reachable yet: try again
                self.failed(error)
                continue
            try:
                while not self.stopping.is_set():
                    number += 1
                    self.sending()
                    try:
                        producer.send(Message("load-native", self.body(number)))
                    except SluiceClientError as error:  # refused or unreachable: not confirmed, go on
                        self.failed(error)
                        continue
                    self.confirm(number)
            finally:
                producer.close()


class Load:
    """One producer per protocol, started together."""

    def __init__(self, group: DevCluster) -> None:
        self.producers = [MqttProducer(group), AmqpProducer(group), NativeProducer(group)]

    def start(self) -> None:
        for producer in self.producers:
            producer.start()

    def counts(self) -> dict[str, int]:
        return {p.protocol: p.count() for p in self.producers}

    def wait_more(self, more: int) -> None:
        """Wait until every producer has ``more`` confirmed messages beyond what it has now."""
        targets = {p: p.count() + more for p in self.producers}
        for producer, target in targets.items():
            producer.wait_confirmed(target)

    def stop(self) -> dict[str, set[int]]:
        for producer in self.producers:
            producer.stopping.set()
        for producer in self.producers:
            producer.join(WAIT_S)
        return {p.protocol: set(p.confirmed) for p in self.producers}


def logged_ids(node: NodeProcess) -> Counter:
    """(protocol, number) -> how often its message is in the node's commit log (read from the
    segment files of a stopped node)."""
    found: Counter = Counter()
    for segment in sorted((node.data_dir / "commitlog").iterdir()):
        found.update((kind.decode(), int(number)) for kind, number in ID.findall(segment.read_bytes()))
    return found


def check_nothing_confirmed_was_lost(confirmed: dict[str, set[int]], nodes: list[NodeProcess]) -> dict:
    """Every confirmed message is in every node's log, every node holds the same messages; the
    totals (confirmed, lost, duplicated) for the report."""
    logs = {node.name: logged_ids(node) for node in nodes}
    wanted = {(protocol, number) for protocol, numbers in confirmed.items() for number in numbers}
    report = {"confirmed": len(wanted)}
    for name, found in logs.items():
        lost = sorted(wanted - set(found))
        assert not lost, f"{name} lacks {len(lost)} confirmed messages, e.g. {lost[:5]}"
    first = next(iter(logs.values()))
    for name, found in logs.items():
        assert found == first, f"{name}'s log holds other messages than {nodes[0].name}'s: the histories diverge"
    report["duplicated"] = sum(count - 1 for count in first.values() if count > 1)
    report["stored_unconfirmed"] = len(set(first) - wanted)
    return report


def finish(group: DevCluster, load: Load) -> dict:
    """Stop the load, let every node catch up, stop them all and check their logs."""
    confirmed = load.stop()
    everyone = {node.name for node in group.nodes}
    in_sync(group, everyone)
    view = cluster_view(group)
    wait_for("every node at the leader's durable end",
             lambda: (v := cluster_view(group)) and len({n["durable_end"] for n in v["nodes"]}) == 1)
    for node in group.nodes:
        assert node.stop() == 0, f"{node.name} did not stop cleanly; see {node.log_path}"
    report = check_nothing_confirmed_was_lost(confirmed, group.nodes)
    print(f"epoch {view['epoch']}: {report}")
    return report


class Partition:
    """nftables rules that cut one node off from etcd, the other nodes and every client (all
    loopback traffic from or to its address, and to the address it reaches etcd at)."""

    TABLE = "sluice_test_partition"

    def __init__(self, node: NodeProcess) -> None:
        assert node.etcd_host, "the node needs an etcd address of its own (etcd_host_per_node)"
        self.node = node

    def cut(self) -> None:
        self.heal()
        rules = [f"ip saddr {self.node.host} drop", f"ip daddr {self.node.host} drop",
                 f"ip daddr {self.node.etcd_host} drop"]
        _nft("add", "table", "inet", self.TABLE)
        _nft("add", "chain", "inet", self.TABLE, "out", "{ type filter hook output priority 0; }")
        for rule in rules:
            _nft("add", "rule", "inet", self.TABLE, "out", *rule.split())

    def heal(self) -> None:
        subprocess.run(["nft", "delete", "table", "inet", self.TABLE], capture_output=True)


def _nft(*arguments: str) -> None:
    subprocess.run(["nft", *arguments], check=True, capture_output=True)
