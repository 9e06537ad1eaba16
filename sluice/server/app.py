"""The composition root: one store, one metadata repository, one core, every listener.

Each adapter gets only the faces of core it uses: the native adapter and the admin API the
client API (``Broker``); MQTT also the named queues and the compacted state store, and gives
core its topic syntax for subject filters; AMQP the client API and the virtual hosts. With
``amqp.guest_from_loopback`` on, the first start also creates RabbitMQ's ``guest`` user.

``start(config)`` opens everything and returns a ``RunningBroker``; ``await running.stop()``
shuts it down in order (stop accepting, stop servers, persist offsets, checkpoint and close the
store, close metadata). ``process.serve`` is `sluice serve` as a process.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import shutil
import socket
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

import analytics
from core.clients import ClientDirectory
from core.errors import SluiceError
from core.assembly import Core
from core.metadata import MetadataRepository
from core.push_subscriptions import PushSubscriptions
from core.sink_policy import SinkPolicy
from core.tokens import UserTokens
from core.service import Broker
from store.errors import StoreLockedError
from store.file_store import FileStore

from protocols.admin import AdminDeps, AdminServer, start_admin_server
from .config import Config, core_settings, env_name, topic_rules
from .port_advice import wrong_port_advice
from protocols.amqp.frontend import AmqpFrontend
from protocols.amqp.listener import AmqpListener, start_amqp_listener
from protocols.amqp.login import GUEST
from protocols.mqtt.frontend import MqttFrontend
from protocols.mqtt.listeners import MqttListeners, start_mqtt_listeners
from protocols.tls import ServerTls, describe, expired
from protocols.mqtt.topics import SYNTAX as MQTT_TOPIC_SYNTAX
from protocols.push.engine import PushEngine

log = logging.getLogger("sluice")

READY_LINE = "Sluice is ready."
"""Printed after every endpoint; scripts and tests wait for it."""

_PORTS = {  # config path -> (what listens there, the flag that moves it)
    "native.port": ("native gRPC", "--native-port"), "admin.port": ("admin API", "--admin-port"),
    "mqtt.port": ("MQTT", "--mqtt-port"), "mqtt.ws_port": ("MQTT WebSocket", "--mqtt-ws-port"),
    "mqtt.tls_port": ("MQTT TLS", "--mqtt-tls-port"),
    "mqtt.wss_port": ("MQTT secure WebSocket", "--mqtt-wss-port"),
    "amqp.port": ("AMQP", "--amqp-port"),
    "amqp.tls_port": ("AMQP TLS", "--amqp-tls-port"),
}


class StartupError(Exception):
    """The broker cannot start; the message says why and what to change."""


@dataclass
class RunningBroker:
    """Everything `sluice serve` started, in start order."""

    config: Config
    store: FileStore
    metadata: MetadataRepository
    core: Core
    native: Any = None
    admin: AdminServer | None = None
    mqtt: MqttFrontend | None = None
    mqtt_listeners: MqttListeners | None = None
    amqp: AmqpFrontend | None = None
    amqp_listener: AmqpListener | None = None
    clients: ClientDirectory = field(default_factory=ClientDirectory)
    """Every protocol's connected clients, for the admin API."""
    push: PushEngine | None = None
    """Push subscriptions' delivery over HTTP (on the leader only, in a replica group)."""
    cluster: Any = None
    """This node's place in its replica group (``cluster_node.ClusterMember``); None alone."""
    tls: ServerTls | None = None
    """The certificate of every TLS listener (None: no ``tls.cert``); ``reload_tls`` reloads it."""
    default_user_created: bool = False
    _stopped: bool = field(default=False, repr=False)

    @property
    def broker(self) -> Broker:
        """Core's client API."""
        return self.core.broker

    @property
    def native_address(self) -> str:
        return _hostport(self.config.native.host, self.native.port)

    @property
    def admin_url(self) -> str:
        assert self.admin is not None, "the admin server is not started"
        return self.admin.url

    def listener_addresses(self) -> dict[str, tuple[str, int]]:
        """(host, port) of every client listener by its port setting (``mqtt.port``, ...)."""
        found = {"native.port": (self.config.native.host, self.native.port),
                 "admin.port": (self.config.admin.host, self.admin.port)}
        if self.mqtt_listeners is not None:
            names = {"tcp": "mqtt.port", "ws": "mqtt.ws_port", "tls": "mqtt.tls_port", "wss": "mqtt.wss_port"}
            found.update({names[name]: (self.config.mqtt.host, port)
                          for name, port in self.mqtt_listeners.ports.items()})
        if self.amqp_listener is not None:
            found["amqp.port"] = (self.config.amqp.host, self.amqp_listener.port)
            if self.amqp_listener.tls_port is not None:
                found["amqp.tls_port"] = (self.config.amqp.host, self.amqp_listener.tls_port)
        return found

    def endpoints(self) -> list[tuple[str, str]]:
        """(what, where) for every endpoint and the data directory, as `sluice serve` prints them."""
        auth = self.config.auth
        if self.default_user_created:
            user = (f"{auth.default_user} / {auth.default_password} (admin, created now; change the "
                    f"password with `sluice user passwd {auth.default_user}`)")
        else:
            user = "not created (users exist); log in as one of them"
        return [
            ("native gRPC", f"{self.native_address}  (sluice send/consume --server "
                            f"{self.native_address}{' --ca CA_FILE' if self._native_tls() else ''})"
                            f"{self._native_tls()}"),
            *self._mqtt_endpoints(),
            *self._amqp_endpoints(),
            ("admin API", f"{self.admin_url}  (sluice ... --admin {self.admin_url}"
                          f"{' --ca CA_FILE' if self.admin_url.startswith('https:') else ''})"),
            ("metrics", f"{self.admin_url}/metrics"),
            ("OpenAPI", f"{self.admin_url}/openapi.json"),
            ("health", f"{self.admin_url}/health"),
            ("data dir", f"{os.path.abspath(self.config.data_dir)}  (flush={self.config.store.flush})"),
            *([("tier", f"{self.config.tier.url}  (sluice tier status)")] if self.config.tier.url else []),
            ("metadata", masked(self.config.metadata_url) if self.config.metadata_url
             else "SQLite in the data dir"),
            ("anonymous", f"allowed, with the rights of user {ANONYMOUS_USER!r}" if auth.allow_anonymous
             else "refused (log in with a user)"),
            ("message trace", "on" if self.config.core.message_trace else
             f"off (restart with {env_name('core.message_trace')}=true or [core] message_trace "
             "= true for `sluice message trace`)"),
            ("default user", user),
        ]

    def _native_tls(self) -> str:
        if self.tls is None or self.config.native.tls == "off":
            return ""
        return "  (TLS)" if self.config.native.tls == "on" else "  (TLS and plaintext)"

    def _mqtt_endpoints(self) -> list[tuple[str, str]]:
        if self.mqtt_listeners is None:
            return []
        host, path = self.config.mqtt.host, self.config.mqtt.ws_path
        forms = {"tcp": ("MQTT TCP", "{}"), "ws": ("MQTT WS", "ws://{}" + path),
                 "tls": ("MQTT TLS", "{}  (TLS)"), "wss": ("MQTT WSS", "wss://{}" + path)}
        return [(forms[name][0], forms[name][1].format(_hostport(host, port)))
                for name, port in self.mqtt_listeners.ports.items()]

    def _amqp_endpoints(self) -> list[tuple[str, str]]:
        if self.amqp_listener is None:
            return []
        where = _hostport(self.config.amqp.host, self.amqp_listener.port)
        if self.config.amqp.guest_from_loopback:
            where += f"  ({GUEST}/{GUEST} from this host only)"
        found = [("AMQP", where)]
        if self.amqp_listener.tls_port is not None:
            found.append(("AMQP TLS", _hostport(self.config.amqp.host,
                                                self.amqp_listener.tls_port) + "  (TLS)"))
        return found

    async def reload_tls(self) -> None:
        """Load the certificate, key and client CA files again for every TLS listener (SIGHUP)."""
        await reload_tls(self.tls, "every TLS listener")

    async def stop(self) -> None:
        """Stop accepting, stop servers, persist offsets, checkpoint and close store and metadata."""
        if self._stopped:
            return
        self._stopped = True
        grace = self.config.shutdown_grace_ms / 1000
        if self.mqtt_listeners is not None:
            await self.mqtt_listeners.stop()
        if self.amqp_listener is not None:
            await self.amqp_listener.stop()
        if self.mqtt is not None:
            await self.mqtt.stop()
        if self.amqp is not None:
            await self.amqp.stop()
        if self.push is not None:
            await self.push.stop()
        servers = [self.native.stop(grace)] if self.native is not None else []
        servers += [self.admin.stop()] if self.admin is not None else []
        stopping = asyncio.gather(*servers)  # each stops accepting at once, then drains
        await asyncio.sleep(0)
        # Closing the broker now answers pending long polls at once, so the servers drain in
        # milliseconds instead of waiting out the grace period for tailing consumers.
        self.core.begin_shutdown()
        await stopping
        await self.core.close()  # persists the offsets, including acks that landed while draining
        try:
            await asyncio.to_thread(self.store.checkpoint)
        except OSError as error:  # a full disk: the next start replays the log from the last one
            log.error("could not checkpoint the store at shutdown (%s); the next start replays "
                      "the log from the last checkpoint", error)
        await asyncio.to_thread(self.store.close)
        await asyncio.to_thread(self.metadata.close)


async def start(config: Config) -> RunningBroker:
    """Open store, metadata and broker, ensure the default user, start the listeners.

    Runs on the event loop that will serve. Raises StartupError with a message for the operator
    (a port in use, a data dir locked by another broker); everything opened so far is closed,
    and a data directory this start created is removed again (with any parent it created), so
    a failed first start leaves no empty store behind to be mistaken for a broker's.
    """
    created = _first_missing(config.data_dir)
    try:
        return await _start(config)
    except BaseException:
        if created is not None:
            await asyncio.to_thread(shutil.rmtree, created, True)
        raise


def _first_missing(path: str) -> str | None:
    """The outermost directory of ``path`` that does not exist yet (``path`` itself, or a
    parent that creating it would create too); None when ``path`` exists."""
    missing = None
    current = os.path.abspath(path)
    while not os.path.exists(current):
        missing, current = current, os.path.dirname(current)
    return missing


async def _start(config: Config, store: FileStore | None = None, cluster: Any = None,
                 metadata: MetadataRepository | None = None) -> RunningBroker:
    """``store`` and ``metadata``: the replicated store and metadata a cluster node leads on
    (else this opens the data dir's); ``cluster``: that node's view of its group."""
    if store is None:
        store = await asyncio.to_thread(_open_store, config)  # a broker already on it says so first
    try:
        for dotted, host, port in _listening_ports(config):
            _check_port(dotted, host, port)
    except StartupError:
        await asyncio.to_thread(store.close)
        raise
    running: RunningBroker | None = None
    try:
        tls = await asyncio.to_thread(_server_tls, config)
        if metadata is None:
            metadata = await asyncio.to_thread(_open_metadata, config)
        settings = core_settings(config)
        if settings.max_message_bytes < config.core.max_message_bytes:
            log.warning("core.max_message_bytes = %d does not fit store.segment_size = %d: "
                        "message bodies are limited to half a segment, %d bytes; raise "
                        "segment_size to allow more", config.core.max_message_bytes,
                        config.store.segment_size, settings.max_message_bytes)
        core = Core(store, metadata, config.data_dir, settings, flush=config.store.flush,
                    subject_syntax=MQTT_TOPIC_SYNTAX, topic_rules=topic_rules(config))
        running = RunningBroker(config, store, metadata, core, cluster=cluster, tls=tls)
        if config.tier.url:
            core.engine.tiering = await asyncio.to_thread(_tiering, config, store, core, cluster)
        await core.start()
        broker = core.broker
        if config.auth.create_default_user:
            running.default_user_created = await asyncio.to_thread(
                broker.users.ensure_default_user, config.auth.default_user,
                config.auth.default_password)
        if config.amqp.guest_from_loopback and core.first_start:
            await asyncio.to_thread(broker.users.ensure_user, GUEST, GUEST, True)
        anonymous = (broker.users.principal(ANONYMOUS_USER) if config.auth.allow_anonymous
                     else None)
        running.mqtt = MqttFrontend(broker, core.queues, core.state, config.mqtt,
                                    allow_anonymous=config.auth.allow_anonymous,
                                    anonymous_principal=anonymous)
        await running.mqtt.start()  # sessions are bound before anything can publish
        running.amqp = AmqpFrontend(broker, core.vhosts, core.queues, config.amqp,
                                    core.vhost_permissions)
        await running.amqp.start()  # and so are the queues bound to amq.topic
        registry = PushSubscriptions(broker, metadata, SinkPolicy.parse(config.push.allowed_sinks),
                                     core.queue_reader)
        core.queue_reader.use(running.amqp.queues)  # push reads them with their TTL, limits, DLX
        running.push = PushEngine(broker, registry, config.push, core.queue_reader)
        await running.push.start()
        running.native = await _listen(config, "native", _start_native(running))
        running.clients.register(running.native.clients)
        running.clients.register(running.mqtt)
        running.clients.register(running.amqp)
        core.vhost_admin.live = running.amqp
        admin_tls = tls.context() if tls is not None and config.admin.tls else None
        running.admin = await _listen(config, "admin",
                                      start_admin_server(_admin_deps(running), config.admin.host,
                                                         config.admin.port, admin_tls))
        client_tls = tls.context(client_certs=True) if tls is not None else None
        certificate_login = tls is not None and tls.config.verifies_clients \
            and tls.config.cert_login
        mqtt_advice: dict[str, str] = {}  # filled below, once every port is known
        amqp_advice: dict[str, str] = {}
        running.mqtt_listeners = await _listen(config, "mqtt", start_mqtt_listeners(
            running.mqtt, config.mqtt, mqtt_advice, client_tls, certificate_login))
        if config.amqp.port >= 0:
            running.amqp_listener = await _listen(config, "amqp", start_amqp_listener(
                running.amqp, config.amqp, client_tls, amqp_advice, certificate_login))
        amqp = running.amqp_listener
        advice = wrong_port_advice(running.native.port, running.admin_url,
                                   running.mqtt_listeners.ports, amqp and amqp.port,
                                   amqp and amqp.tls_port)
        mqtt_advice.update(advice[0])
        amqp_advice.update(advice[1])
        return running
    except BaseException:
        if running is not None:
            await running.stop()
        else:
            await asyncio.to_thread(store.close)
        raise


async def reload_tls(tls: ServerTls | None, where: str) -> None:
    """Load ``tls``'s certificate, key and client CA files again (SIGHUP): new handshakes on
    ``where`` get them, open connections go on. A file that cannot be used is logged as an
    error and the old certificate and CA stay. Runs on the event loop."""
    if tls is None:
        log.info("SIGHUP: no certificate is configured for %s (tls.cert), nothing to reload",
                 where)
        return
    try:
        served = await asyncio.to_thread(tls.reload)
    except ValueError as error:
        log.error("SIGHUP: the TLS files of %s were not reloaded, the old certificate and "
                  "client CA are still used: %s", where, error)
        return
    log.info("SIGHUP: reloaded the TLS certificate of %s (%s, %s); new connections get it, "
             "open ones go on: %s", where, tls.config.cert, tls.config.key, served)


def _server_tls(config: Config) -> ServerTls | None:
    """The certificate of every TLS listener, if configured; StartupError if it cannot be used.
    An expired (or not yet valid) one is served, with a warning: clients refuse it, and a
    SIGHUP after renewing the files fixes that without a restart. Blocks on file reads."""
    if not config.tls.enabled:
        return None
    try:
        tls = ServerTls(config.tls)
    except ValueError as error:
        raise StartupError(f"{error} (tls.cert / tls.key, --tls-cert / --tls-key)") from None
    if expired(tls.certificate):
        log.warning("the TLS certificate %s is outside its validity period, so clients will "
                    "refuse it: renew it and send SIGHUP; it is %s", config.tls.cert,
                    describe(tls.certificate))
    return tls


def _tiering(config: Config, store: FileStore, core: Core, cluster: Any) -> Any:
    """Tiered storage over ``store`` (``sluice.server.tiering``): the loop core's engine runs.
    The epoch is the leadership's in a replica group (only the leader runs this), else 0."""
    from . import tiering  # pyarrow and boto3: loaded only when a tier is configured

    topics = core.engine.topics

    def body_schema(topic: str) -> str | None:
        return topics.get(topic).body_schema if topic in topics else None

    def epoch() -> int:
        return int(cluster.node.coordinator.epoch or 0) if cluster is not None else 0

    try:
        return tiering.build(config.tier, config.data_dir, store, body_schema, topics.list, epoch)
    except ValueError as error:
        raise StartupError(str(error)) from None


def _open_store(config: Config) -> FileStore:
    os.makedirs(config.data_dir, exist_ok=True)
    try:
        return FileStore(config.data_dir, config.store)
    except StoreLockedError:
        raise StartupError(f"data dir {os.path.abspath(config.data_dir)} is in use by another "
                           "broker; stop it, or pass another directory with --data-dir") from None


def _open_metadata(config: Config, key: bytes | None = None) -> MetadataRepository:
    """``key``: the master key (a cluster's, shared by its nodes; else the data dir's own)."""
    try:
        return MetadataRepository.for_data_dir(config.data_dir, config.metadata_url, key)
    except SluiceError:
        raise
    except Exception as error:  # a driver's connection or URL error: name the setting to fix
        where = masked(config.metadata_url) if config.metadata_url else "SQLite in the data dir"
        raise StartupError(f"cannot open the metadata database ({where}): {error}; check "
                           "--metadata-url (SLUICE_METADATA_URL) and that the database is "
                           "reachable") from error


ANONYMOUS_USER = "anonymous"
"""Calls without credentials act for this user when anonymous access is on: create it and grant
it what anonymous clients may do (`sluice user create anonymous`, `sluice user grant ...`)."""


def _start_native(running: RunningBroker):
    from protocols.native.server import start_native_server

    native, auth = running.config.native, running.config.auth
    anonymous = running.broker.users.principal(ANONYMOUS_USER) if auth.allow_anonymous else None
    return start_native_server(running.broker, native.host, native.port,
                               advertised_host=native.advertised_host,
                               allow_anonymous=auth.allow_anonymous, anonymous_principal=anonymous,
                               signature_max_skew_s=native.signature_max_skew_s,
                               tls=running.tls, tls_mode=native.tls)


def _admin_deps(running: RunningBroker) -> AdminDeps:
    return AdminDeps(running.broker, running.store, running.metadata, queues=running.core.queues,
                     clients=running.clients, vhosts=running.core.vhost_admin,
                     dashboard_dir=analytics.DASHBOARD_DIR, cluster=running.cluster,
                     retained=running.mqtt.registry.retained if running.mqtt else None,
                     push=running.push,
                     session_idle_timeout_s=running.config.admin.session_idle_timeout_s,
                     events_max_body_bytes=running.config.admin.events_max_body_bytes,
                     tokens=UserTokens(running.metadata, running.broker.users),
                     tier=running.core.engine.tiering)


async def _listen(config: Config, section: str, starting: Any) -> Any:
    """Await a server start; a port of ``section`` that turns out to be taken becomes a
    StartupError naming that port."""
    try:
        return await starting
    except (OSError, RuntimeError, ValueError) as error:
        ports = [p for p in _listening_ports(config) if p[0].startswith(section + ".")]
        for dotted, host, port in ports:
            _check_port(dotted, host, port)
        what = " and ".join(f"{_PORTS[dotted][0]} on {_hostport(host, port)}"
                            for dotted, host, port in ports)
        raise StartupError(f"cannot start the {what} listener: {error}") from error


def _listening_ports(config: Config) -> list[tuple[str, str, int]]:
    """(config path, host, port) of every listener this configuration opens."""
    mqtt = config.mqtt
    secure = config.tls.enabled
    found = [("native.port", config.native.host, config.native.port),
             ("admin.port", config.admin.host, config.admin.port),
             ("mqtt.port", mqtt.host, mqtt.port), ("mqtt.ws_port", mqtt.host, mqtt.ws_port),
             ("amqp.port", config.amqp.host, config.amqp.port)]
    if secure:
        found += [("mqtt.tls_port", mqtt.host, mqtt.tls_port),
                  ("mqtt.wss_port", mqtt.host, mqtt.wss_port)]
        if config.amqp.port >= 0:
            found.append(("amqp.tls_port", config.amqp.host, config.amqp.tls_port))
    return [(dotted, host, port) for dotted, host, port in found if port >= 0]


def _check_port(dotted: str, host: str, port: int) -> None:
    if port > 0 and _port_taken(host, port):
        raise _port_error(dotted, host, port)


def _port_taken(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def _port_error(dotted: str, host: str, port: int) -> StartupError:
    what, flag = _PORTS[dotted]
    section, key = dotted.split(".")
    return StartupError(f"port {port} on {host} ({what}) is already in use; stop whatever holds "
                        f"it, or pick another port with {flag} N (or {env_name(dotted)}, "
                        f"or [{section}] {key} in the config file)")


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***``, for printing."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def print_endpoints(running: RunningBroker, out: TextIO = sys.stdout) -> None:
    width = max(len(what) for what, _ in running.endpoints())
    print(f"Sluice is running (pid {os.getpid()}):", file=out)
    for what, where in running.endpoints():
        print(f"  {what:<{width}}  {where}", file=out)
    print(f"{READY_LINE} Stop it with Ctrl+C or SIGTERM.", file=out, flush=True)
