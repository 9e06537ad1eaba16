"""The broker's configuration: one frozen dataclass tree, from a TOML file, then env, then flags.

Every leaf has a dotted path (``store.flush``, ``native.port``). The same path names its TOML
key (``[store]`` ``flush = "sync"``), its environment variable (``SLUICE_STORE_FLUSH``: the
path upper-cased with ``.`` as ``_``) and the override a CLI flag sets. Later sources win:
defaults < file < environment < flags. ``SLUICE_HOST`` (and ``--host``) sets the host of every
listener; a listener's own ``SLUICE_<NAME>_HOST`` wins over it. The ``SLUICE_*`` variables in
``TOOL_VARIABLES`` belong to the command line tools and the tests and are ignored here.

An unknown key in the file is an error that names the key and lists the known ones, so a typo
never silently falls back to a default. An unknown ``SLUICE_*`` variable cannot be an error (the
shell may hold variables for other Sluice versions), so ``unknown_variables`` names each one and
the closest setting for `sluice serve` to warn about.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from core.errors import InvalidArgument
from core.memory_alarm import watermark_bytes
from core.settings import CoreConfig
from core.topic_map import SubjectTopics, parse_rules
from sluice.cluster.settings import ClusterConfig
from store.api import StoreConfig
from protocols.amqp.options import AmqpOptions
from protocols.mqtt.options import MqttOptions
from protocols.mqtt.topics import SYNTAX as MQTT_TOPIC_SYNTAX
from protocols.push.options import PushOptions
from protocols.tls import TlsConfig, check_settings as check_tls

from .logs import LogConfig

ENV_PREFIX = "SLUICE_"
HOST_ALIAS = "host"
"""Override path that sets the host of every listener."""
TOOL_VARIABLES = {
    "SLUICE_CONFIG": "the config file of `sluice serve` (--config)",
    "SLUICE_USER": "the user the `sluice` commands log in as (--user)",
    "SLUICE_PASSWORD": "its password (--password)",
    "SLUICE_SERVER": "the native endpoint of `sluice send/consume` (--server)",
    "SLUICE_ADMIN_URL": "the admin API of the `sluice` admin commands (--admin)",
    "SLUICE_CA": "the CA file the `sluice` commands verify the broker's certificate with (--ca)",
    "SLUICE_TEST_POSTGRES_URL": "the PostgreSQL database of the metadata tests",
    "SLUICE_CRASH_SEED": "the seed of the store's SIGKILL test",
    "SLUICE_BENCH_PROGRESS": "progress lines from the latency benchmark",
    "SLUICE_TIER_PAUSE_AT": "the tiering step the crash tests stop at (docs/tiering.md)",
    "SLUICE_TIER_PAUSE_FILE": "the file the tierer creates when it stops there",
}
"""``SLUICE_*`` variables that are not broker settings, and what reads them."""


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and its source."""


@dataclass(frozen=True)
class NativeListener:
    """The native gRPC listener (RocketMQ 5 proxy API)."""

    host: str = "127.0.0.1"
    """Address the native gRPC listener binds (``--host`` sets every listener's)."""
    port: int = 8081
    """Native gRPC port: RocketMQ 5 clients, the SDK, `sluice send` and `sluice consume`
    (0 picks a free port)."""
    advertised_host: str | None = None
    """Host clients are told to reconnect to; None means ``host``."""
    signature_max_skew_s: int = 900
    """A signed request is refused when its ``x-mq-date-time`` is further than this many seconds
    from the broker's clock, so a captured request cannot be replayed later."""
    tls: Literal["on", "off", "mixed"] = "on"
    """With a certificate (``tls.cert``): "on" serves TLS only; "mixed" serves TLS and plaintext
    on the same port (told apart by the first byte, as RocketMQ's proxy in its TLS test mode),
    for moving clients over one by one; "off" serves plaintext only. Without a certificate the
    port is plaintext whatever this says."""


@dataclass(frozen=True)
class AdminListener:
    """The admin HTTP API, Prometheus metrics and OpenAPI document."""

    host: str = "127.0.0.1"
    """Address the admin HTTP API binds."""
    port: int = 8080
    """Admin HTTP API port, which also serves ``/metrics``, ``/health`` and ``/openapi.json``."""
    tls: bool = True
    """Serve HTTPS with ``tls.cert`` when one is configured; false keeps plain HTTP (for a port
    reachable from this host only, behind a proxy that terminates TLS)."""
    session_idle_timeout_s: int = 1800
    """A browser session (the console's sign-in, ``POST /session``) ends after this many seconds
    without a request; the next request needs a new sign-in."""
    events_max_body_bytes: int = 1 << 20
    """The largest request body ``POST /events/{topic}`` (the CloudEvents ingress) reads;
    longer ones are refused with 413."""

    def __post_init__(self) -> None:
        if self.session_idle_timeout_s < 1:
            raise ValueError(f"admin.session_idle_timeout_s = {self.session_idle_timeout_s} must "
                             "be at least 1 (seconds; the default is 1800)")
        if self.events_max_body_bytes < 1:
            raise ValueError(f"admin.events_max_body_bytes = {self.events_max_body_bytes} must "
                             "be at least 1 (bytes; the default is 1048576)")


@dataclass(frozen=True)
class AuthConfig:
    """Who may connect. The default user is created only when no user exists at all."""

    allow_anonymous: bool = False
    """Accept connections without credentials; they act as the user ``anonymous``."""
    create_default_user: bool = True
    """On a first start with no user at all, create ``default_user`` as an admin."""
    default_user: str = "sluice"
    """Name of the admin user created on first start."""
    default_password: str = "sluice"
    """Its password; change it (`sluice user passwd`) before exposing the broker."""


@dataclass(frozen=True)
class TierConfig:
    """Tiered storage: sealed segments copied to object storage as Parquet (``docs/tiering.md``).
    Without ``url`` nothing is tiered and the store keeps its history locally, as always."""

    url: str = ""
    """Where the tier lives: ``file:///absolute/dir`` or ``s3://bucket/prefix``; empty turns
    tiering off."""
    s3_endpoint: str = ""
    """The S3 endpoint of an ``s3://`` tier (``http://127.0.0.1:8333`` for SeaweedFS, MinIO);
    empty: AWS."""
    s3_region: str = "us-east-1"
    """The S3 region of an ``s3://`` tier."""
    s3_access_key: str = ""
    """The S3 access key; empty: ``SLUICE_TIER_S3_ACCESS_KEY``, else boto3's own chain
    (``AWS_ACCESS_KEY_ID``, instance roles)."""
    s3_secret_key: str = ""
    """The S3 secret key (see ``s3_access_key``)."""
    check_interval_ms: int = 2_000
    """How often the broker looks for sealed segments to tier and applies tier retention."""
    max_lag_ms: int = 600_000
    """``/health`` says degraded when the oldest sealed segment not yet tiered was sealed longer
    ago than this."""
    cache_bytes: int = 256 << 20
    """Memory for decoded row groups of tiered files read back by consumers (LRU)."""
    retry_max_ms: int = 60_000
    """After a failure the broker retries with a doubling backoff, at most this long apart."""

    def __post_init__(self) -> None:
        for name in ("check_interval_ms", "max_lag_ms", "cache_bytes", "retry_max_ms"):
            if getattr(self, name) <= 0:
                raise ValueError(f"tier.{name} = {getattr(self, name)} must be greater than 0 "
                                 f"(the default is {getattr(TierConfig, name)})")
        if self.url and (problem := tier_url_problem(self.url)) is not None:
            raise ValueError(problem)
        if self.s3_endpoint and not self.s3_endpoint.startswith(("http://", "https://")):
            raise ValueError(f"tier.s3_endpoint = {self.s3_endpoint!r} is not a URL: write "
                             "http://HOST:PORT (or https://...), e.g. http://127.0.0.1:8333")


def tier_url_problem(url: str) -> str | None:
    """What is wrong with a ``tier.url``, None if it names a tier Sluice can open."""
    example = ("write file:///absolute/directory or s3://bucket/prefix "
               "(SLUICE_TIER_URL, [tier] url)")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("file", "s3"):
        return f"tier.url = {url!r} is neither a file:// nor an s3:// URL: {example}"
    if scheme == "file" and not rest.startswith("/"):
        return f"tier.url = {url!r} names a relative directory: {example}"
    if scheme == "s3" and not rest.split("/", 1)[0]:
        return f"tier.url = {url!r} names no bucket: {example}"
    return None


@dataclass(frozen=True)
class Config:
    """Everything `sluice serve` needs. ``metadata_url`` None means SQLite inside ``data_dir``."""

    data_dir: str = "./data"
    """Directory holding the store, the metadata database (SQLite) and the master key."""
    metadata_url: str | None = None
    """SQLAlchemy URL of the metadata database (``postgresql+psycopg://...``); unset: SQLite
    in ``data_dir``."""
    shutdown_grace_ms: int = 5_000
    """How long a stopping broker waits for connections and long polls to end."""
    store: StoreConfig = field(default_factory=StoreConfig)
    core: CoreConfig = field(default_factory=CoreConfig)
    native: NativeListener = field(default_factory=NativeListener)
    admin: AdminListener = field(default_factory=AdminListener)
    auth: AuthConfig = field(default_factory=AuthConfig)
    mqtt: MqttOptions = field(default_factory=MqttOptions)
    amqp: AmqpOptions = field(default_factory=AmqpOptions)
    log: LogConfig = field(default_factory=LogConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    push: PushOptions = field(default_factory=PushOptions)
    tier: TierConfig = field(default_factory=TierConfig)

    @property
    def listeners(self) -> dict[str, NativeListener | AdminListener | MqttOptions | AmqpOptions]:
        """Every listener section by name (the MQTT section's ``port`` is its TCP listener)."""
        return {"native": self.native, "admin": self.admin, "mqtt": self.mqtt, "amqp": self.amqp}


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> Config:
    """Defaults, then the TOML file at ``path``, then ``env``, then ``overrides`` (dotted paths).

    ``overrides`` values are typed already (CLI flags); None values are skipped, so an unset flag
    changes nothing. Raises ConfigError naming the offending key and where it came from.
    """
    values: dict[str, Any] = {}
    if path is not None:
        values.update(_read_file(Path(path)))
    values.update(_from_env(env or {}))
    for key, value in (overrides or {}).items():
        if value is not None:
            _set(values, _expand(key), value, "command line")
    config = _tls_aliases(_build(Config, values, ""))
    topic_rules(config)
    return config


DEPRECATED = {"mqtt.tls_cert": "tls.cert", "mqtt.tls_key": "tls.key"}
"""Settings kept working under an old name: old dotted path -> the one to write instead."""


def _tls_aliases(config: Config) -> Config:
    """``mqtt.tls_cert``/``mqtt.tls_key`` (the certificate before ``[tls]``) stand for
    ``tls.cert``/``tls.key`` when those are unset; both set differently is an error."""
    mqtt, tls = config.mqtt, config.tls
    if not (mqtt.tls_cert or mqtt.tls_key):
        return config
    if (tls.cert or tls.key) and (tls.cert, tls.key) != (mqtt.tls_cert, mqtt.tls_key):
        raise ConfigError("mqtt.tls_cert/mqtt.tls_key and tls.cert/tls.key name different files; "
                          "remove mqtt.tls_cert and mqtt.tls_key (replaced by [tls] cert and key)")
    if bool(mqtt.tls_cert) != bool(mqtt.tls_key):
        raise ConfigError("mqtt.tls_cert and mqtt.tls_key must be set together (better: tls.cert "
                          "and tls.key, which replace them)")
    tls = dataclasses.replace(tls, cert=mqtt.tls_cert, key=mqtt.tls_key)
    if (problem := check_tls(tls)) is not None:
        raise ConfigError(problem)
    return dataclasses.replace(config, tls=tls)


def deprecation_warnings(config: Config) -> list[str]:
    """A warning for each deprecated setting ``config`` uses, naming the one to use instead."""
    used = {"mqtt.tls_cert": config.mqtt.tls_cert, "mqtt.tls_key": config.mqtt.tls_key}
    return [f"{old} ({env_name(old)}) is deprecated and will be removed: write {new} "
            f"([tls] {new.split('.')[1]}, {env_name(new)}) instead; it applies to every TLS "
            "listener" for old, new in DEPRECATED.items() if used[old]]


def topic_rules(config: Config) -> tuple[tuple[str, str], ...]:
    """The ``mqtt.topic_map`` rules, checked; ConfigError says what is wrong with them."""
    try:
        rules = parse_rules(config.mqtt.topic_map)
        SubjectTopics(MQTT_TOPIC_SYNTAX, rules)
    except InvalidArgument as error:
        raise ConfigError(f"mqtt.topic_map: {error}") from None
    return rules


def core_settings(config: Config) -> CoreConfig:
    """``config.core`` with ``max_message_bytes`` at most half a store segment: a record holds
    its properties, keys and fan-out besides the body, and must fit in one segment, so a
    larger body could never be stored (the default segment, 128 MiB, leaves 16 MiB alone).
    A cluster node keeps consumer offsets in the replicated log (``replicated_state``)."""
    settings = config.core
    if config.cluster.enabled and not settings.replicated_state:
        settings = dataclasses.replace(settings, replicated_state=True)
    most = config.store.segment_size // 2
    if settings.max_message_bytes <= most:
        return settings
    return dataclasses.replace(settings, max_message_bytes=most)


def env_name(dotted: str) -> str:
    """The environment variable for a dotted path: ``native.port`` -> ``SLUICE_NATIVE_PORT``."""
    return ENV_PREFIX + dotted.replace(".", "_").upper()


def leaf_paths(cls: type = Config, prefix: str = "") -> dict[str, Any]:
    """Every leaf's dotted path and its type hint."""
    found: dict[str, Any] = {}
    for name, hint in _hints(cls).items():
        dotted = f"{prefix}{name}"
        if _is_section(hint):
            found.update(leaf_paths(hint, dotted + "."))
        else:
            found[dotted] = hint
    return found


# --- sources ---

def _read_file(path: Path) -> dict[str, Any]:
    """Flatten the TOML file into {dotted path: (value, source)}; unknown keys are errors."""
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; pass an existing file to "
                          "--config or unset SLUICE_CONFIG") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"config file {path} is not valid TOML: {error}") from None
    flat: dict[str, Any] = {}
    _flatten(document, Config, "", str(path), flat)
    return flat


def _flatten(table: Mapping[str, Any], cls: type, prefix: str, source: str,
             out: dict[str, Any]) -> None:
    hints = _hints(cls)
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if key not in hints:
            section = f"[{prefix[:-1]}]" if prefix else "the top level"
            raise ConfigError(f"{source}: unknown key {dotted!r}; known keys in {section}: "
                              f"{', '.join(sorted(hints))}")
        hint = hints[key]
        if _is_section(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {dotted!r} must be a table ([{dotted}])")
            _flatten(value, hint, dotted + ".", source, out)
        else:
            out[dotted] = (value, source)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """Values of the SLUICE_* variables that name a leaf (and SLUICE_HOST), parsed from text."""
    found: dict[str, Any] = {}
    if (host := env.get(env_name(HOST_ALIAS))) is not None:
        for dotted in _expand(HOST_ALIAS):
            found[dotted] = (host, env_name(HOST_ALIAS))
    for dotted, hint in leaf_paths().items():
        name = env_name(dotted)
        if name in env:
            found[dotted] = (_parse_text(env[name], hint, name), name)
    return found


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """A warning for each ``SLUICE_*`` variable in ``env`` that is neither a setting nor one of
    ``TOOL_VARIABLES``, naming the closest known name (a typo would otherwise be ignored)."""
    settings = [env_name(dotted) for dotted in leaf_paths()] + [env_name(HOST_ALIAS)]
    known = set(settings) | set(TOOL_VARIABLES)
    warnings = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        # Compared without the prefix every name shares, which would make any two look alike.
        close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX),
                                          sorted(k.removeprefix(ENV_PREFIX) for k in known),
                                          n=1, cutoff=0.6)
        hint = (f"did you mean {ENV_PREFIX}{close[0]}?" if close else
                "`sluice serve --settings` lists every setting's variable")
        warnings.append(f"environment variable {name} is not a Sluice setting and is ignored; "
                        f"{hint}")
    return warnings


def _expand(key: str) -> list[str]:
    """Dotted paths an override key stands for: ``host`` means every listener's host."""
    if key == HOST_ALIAS:
        return [f"{name}.host" for name in Config().listeners] + ["cluster.host"]
    return [key]


def _set(values: dict[str, Any], paths: list[str], value: Any, source: str) -> None:
    known = leaf_paths()
    for dotted in paths:
        if dotted not in known:
            raise ConfigError(f"{source}: unknown setting {dotted!r}")
        values[dotted] = (value, source)


# --- typing ---

def _is_section(hint: Any) -> bool:
    """Whether a field's type is a nested dataclass (a TOML table), not a leaf value."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _parse_text(text: str, hint: Any, source: str) -> Any:
    """An environment variable's text as a value of type ``hint`` (checked again in _check)."""
    options = _options(hint)
    stripped = text.strip()
    if type(None) in options and stripped.lower() in ("", "none", "null"):
        return None
    if bool in options:
        lowered = stripped.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{source}={text!r}: expected true or false")
    if int in options:
        try:
            return int(stripped.replace("_", ""))
        except ValueError:
            raise ConfigError(f"{source}={text!r}: expected a whole number") from None
    if float in options:
        try:
            return float(stripped)
        except ValueError:
            raise ConfigError(f"{source}={text!r}: expected a number") from None
    return text


def _options(hint: Any) -> tuple[Any, ...]:
    """The types a hint accepts: ``int | None`` -> (int, NoneType); Literal -> its values' types."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return tuple(o for arg in typing.get_args(hint) for o in _options(arg))
    if origin is typing.Literal:
        return tuple({type(v) for v in typing.get_args(hint)})
    return (hint,)


def _check(value: Any, hint: Any, dotted: str, source: str) -> Any:
    """``value`` if it fits ``hint``, else ConfigError naming the key, its source and the type."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        choices = typing.get_args(hint)
        if value in choices:
            return value
        raise ConfigError(f"{source}: {dotted} = {value!r} is not one of "
                          f"{', '.join(map(repr, choices))}")
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(hint):
            try:
                return _check(value, arg, dotted, source)
            except ConfigError:
                continue
        raise ConfigError(f"{source}: {dotted} = {value!r} should be {_describe(hint)}")
    if hint is type(None):
        if value is None:
            return None
    elif hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif hint in (bool, str) and isinstance(value, hint):
        return value
    raise ConfigError(f"{source}: {dotted} = {value!r} should be {_describe(hint)}")


def _describe(hint: Any) -> str:
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "a string",
             type(None): "unset"}
    return " or ".join(names.get(o, str(o)) for o in _options(hint))


def _build(cls: type, values: Mapping[str, Any], prefix: str) -> Any:
    """Instantiate ``cls`` from the flat {dotted: (value, source)} map; defaults fill the rest."""
    kwargs: dict[str, Any] = {}
    for name, hint in _hints(cls).items():
        dotted = f"{prefix}{name}"
        if _is_section(hint):
            kwargs[name] = _build(hint, values, dotted + ".")
        elif dotted in values:
            value, source = values[dotted]
            kwargs[name] = _check(value, hint, dotted, source)
    try:
        built = cls(**kwargs)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"invalid [{prefix[:-1] or 'top level'}] settings: {error}") from None
    if prefix == "":
        _validate(built)
    return built


def _validate(config: Config) -> None:
    """Range checks the types alone do not express."""
    for name, listener in config.listeners.items():
        if name not in ("mqtt", "amqp") and not 0 <= listener.port <= 65_535:
            raise ConfigError(f"{name}.port = {listener.port} is out of range: use 0-65535 "
                              "(0 picks a free port)")
    mqtt = config.mqtt
    for key in ("port", "ws_port", "tls_port", "wss_port"):
        if not -1 <= getattr(mqtt, key) <= 65_535:
            raise ConfigError(f"mqtt.{key} = {getattr(mqtt, key)} is out of range: use 0-65535 "
                              "(0 picks a free port, -1 turns the listener off)")
    for key in ("port", "tls_port"):
        if not -1 <= getattr(config.amqp, key) <= 65_535:
            raise ConfigError(f"amqp.{key} = {getattr(config.amqp, key)} is out of range: use "
                              "0-65535 (0 picks a free port, -1 turns the listener off)")
    try:
        config.amqp.connection_options()
    except ValueError as error:
        raise ConfigError(f"[amqp] {error}") from None
    if (problem := check_tls(config.tls)) is not None:
        raise ConfigError(problem)
    if config.native.port and config.native.port == config.admin.port \
            and config.native.host == config.admin.host:
        raise ConfigError(f"native.port and admin.port are both {config.native.port}; "
                          "give each listener its own port")
    mqtt_limits = ("connect_timeout_s", "max_pending_connections", "max_connect_packet_size",
                   "max_client_id_length", "max_topic_length", "max_topic_levels",
                   "max_user_properties", "max_subscriptions", "max_retained_messages",
                   "max_retained_bytes")
    positive = {"store.flush_interval_ms": config.store.flush_interval_ms,
                "store.segment_size": config.store.segment_size,
                "store.checkpoint_interval_ms": config.store.checkpoint_interval_ms,
                "store.max_open_queue_files": config.store.max_open_queue_files,
                "shutdown_grace_ms": config.shutdown_grace_ms,
                "native.signature_max_skew_s": config.native.signature_max_skew_s,
                **{f"mqtt.{name}": getattr(config.mqtt, name) for name in mqtt_limits},
                "amqp.connect_timeout_s": config.amqp.connect_timeout_s,
                "amqp.max_message_size": config.amqp.max_message_size}
    for dotted, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{dotted} = {value} must be greater than 0")
    if not config.data_dir:
        raise ConfigError("data_dir is empty; name the directory that holds the store")
    _validate_cluster(config.cluster)
    try:
        watermark_bytes(config.core.memory_high_watermark)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _validate_cluster(cluster: ClusterConfig) -> None:
    if not cluster.enabled:
        return
    if not cluster.node_id:
        raise ConfigError("cluster.etcd is set, so this node needs a name: --node-id NAME (or "
                          "SLUICE_CLUSTER_NODE_ID), unique in the group and the same at every start")
    if not cluster.secret:
        raise ConfigError("cluster.etcd is set, so the group needs a shared secret: [cluster] secret "
                          "(or SLUICE_CLUSTER_SECRET), the same on every node; a peer without it "
                          "gets nothing from the replication port")
    if not 0 < cluster.replication_port <= 65_535:
        raise ConfigError(f"cluster.replication_port = {cluster.replication_port} is out of range: 1-65535")
    if cluster.min_insync < 1:
        raise ConfigError(f"cluster.min_insync = {cluster.min_insync} must be at least 1")
    if cluster.lease_ttl_s < 2 or cluster.lease_margin_ms >= cluster.lease_ttl_s * 1000:
        raise ConfigError(f"cluster.lease_ttl_s = {cluster.lease_ttl_s} must be at least 2 and more "
                          f"than cluster.lease_margin_ms = {cluster.lease_margin_ms}")
    if cluster.replica_timeout_ms <= 0:
        raise ConfigError("cluster.replica_timeout_ms must be greater than 0")
    for url in cluster.endpoints:
        if not url.startswith(("http://", "https://")) or ":" not in url.split("//", 1)[1]:
            raise ConfigError(f"cluster.etcd: {url!r} is not an etcd client URL such as "
                              "http://127.0.0.1:2379")


def describe_sources() -> list[tuple[str, str, str]]:
    """(dotted path, environment variable, default) for every setting, for docs and --help."""
    defaults = _flat_defaults(Config(), "")
    return [(dotted, env_name(dotted), repr(defaults[dotted])) for dotted in leaf_paths()]


def _flat_defaults(obj: Any, prefix: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            found.update(_flat_defaults(value, f"{prefix}{f.name}."))
        else:
            found[f"{prefix}{f.name}"] = value
    return found
