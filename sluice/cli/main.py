"""The `sluice` command: `serve` (the broker), admin and data commands against it, offline store tools.

`serve` builds the configuration (file, then SLUICE_* environment, then these flags) and hands it
to the composition root in ``sluice.server`` (``process.serve``). `topic`, `group`, `message` and `user` talk to a
running broker's admin HTTP API (``sluice.cli.admin``); `send` and `consume` use the native
SDK (``sluice.cli.data``); `store inspect|verify` read a data directory offline.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from .admin import add_admin_commands
from .analytics import add_analytics_commands
from .clients import add_client_commands
from .cluster import add_cluster_commands
from .data import add_data_commands
from .demo import add_demo_command
from .dev_cert import add_dev_cert_command
from .health import add_health_command
from .push import add_push_commands
from .tier import add_tier_commands
from .tokens import add_token_commands
from .simulate import add_simulate_command
from .vhosts import add_vhost_commands

SERVE_FLAGS = {  # flag destination -> config path it overrides
    "data_dir": "data_dir", "flush": "store.flush", "flush_interval_ms": "store.flush_interval_ms",
    "host": "host", "native_port": "native.port", "admin_port": "admin.port",
    "advertised_host": "native.advertised_host", "metadata_url": "metadata_url",
    "allow_anonymous": "auth.allow_anonymous", "mqtt_port": "mqtt.port",
    "mqtt_ws_port": "mqtt.ws_port", "mqtt_tls_port": "mqtt.tls_port",
    "mqtt_wss_port": "mqtt.wss_port", "amqp_port": "amqp.port",
    "amqp_tls_port": "amqp.tls_port", "tls_cert": "tls.cert", "tls_key": "tls.key",
    "tls_client_ca": "tls.client_ca", "tls_client_certs": "tls.client_certs",
    "native_tls": "native.tls",
    "log_level": "log.level", "log_format": "log.format",
    "cluster_etcd": "cluster.etcd", "node_id": "cluster.node_id",
    "replication_port": "cluster.replication_port",
}


def _serve(args: argparse.Namespace) -> int:
    """Run the broker until SIGTERM/SIGINT with the configuration from file, environment and flags."""
    from ..server.process import serve
    from ..server.config import (ConfigError, deprecation_warnings, describe_sources, load_config,
                                 unknown_variables)

    if args.settings:
        print(f"{'config file key':<40} {'environment variable':<44} default")
        for dotted, env, default in describe_sources():
            print(f"{dotted:<40} {env:<44} {default}")
        return 0
    try:
        config = load_config(args.config, os.environ,
                             {path: getattr(args, dest) for dest, path in SERVE_FLAGS.items()})
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return serve(config, deprecation_warnings(config) + unknown_variables(os.environ))


def _add_serve(commands: argparse._SubParsersAction) -> None:
    text = ("Run the broker: native gRPC on 127.0.0.1:8081, MQTT on 1883, AMQP on 5672, admin "
            "API and metrics on 127.0.0.1:8080. Settings come from --config FILE (TOML), then SLUICE_* environment "
            "variables (SLUICE_NATIVE_PORT, SLUICE_STORE_FLUSH, ...), then these flags.")
    serve = commands.add_parser("serve", help="Run the broker.", description=text)
    serve.add_argument("--config", metavar="FILE", default=os.environ.get("SLUICE_CONFIG"),
                       help="TOML config file (default: $SLUICE_CONFIG, else none)")
    serve.add_argument("--data-dir", metavar="DIR", help="directory holding the store and "
                       "metadata (default: ./data)")
    serve.add_argument("--flush", choices=["sync", "async"],
                       help="sync: acknowledge after fsync (default); async: fsync on an interval")
    serve.add_argument("--flush-interval-ms", type=int, metavar="MS",
                       help="fsync interval under --flush async (default: 200)")
    serve.add_argument("--host", help="address every listener binds (default: 127.0.0.1)")
    serve.add_argument("--native-port", type=int, metavar="PORT",
                       help="native gRPC port (default: 8081; 0 picks a free one)")
    serve.add_argument("--admin-port", type=int, metavar="PORT",
                       help="admin API and metrics port (default: 8080; 0 picks a free one)")
    serve.add_argument("--mqtt-port", type=int, metavar="PORT",
                       help="MQTT over TCP port (default: 1883; 0 picks a free one, -1 turns it off)")
    serve.add_argument("--mqtt-ws-port", type=int, metavar="PORT",
                       help="MQTT over WebSocket port, path /mqtt (default: 8083; -1 turns it off)")
    serve.add_argument("--mqtt-tls-port", type=int, metavar="PORT",
                       help="MQTT over TLS port, opened with --tls-cert/--tls-key (default: 8883)")
    serve.add_argument("--mqtt-wss-port", type=int, metavar="PORT",
                       help="MQTT over secure WebSocket port, opened with --tls-cert/--tls-key "
                       "(default: 8084)")
    serve.add_argument("--amqp-port", type=int, metavar="PORT",
                       help="AMQP 0-9-1 port (default: 5672; 0 picks a free one, -1 turns it off)")
    serve.add_argument("--amqp-tls-port", type=int, metavar="PORT",
                       help="AMQP 0-9-1 over TLS port, opened with --tls-cert/--tls-key "
                       "(default: 5671)")
    serve.add_argument("--tls-cert", metavar="PEM",
                       help="certificate chain of every TLS listener: MQTT TLS/WSS, AMQP TLS, "
                       "admin HTTPS, native gRPC (SIGHUP reloads it; `sluice dev-cert` makes one)")
    serve.add_argument("--tls-key", metavar="PEM", help="private key for --tls-cert")
    serve.add_argument("--tls-client-ca", metavar="PEM",
                       help="CA certificates that client certificates must be signed by")
    serve.add_argument("--tls-client-certs", choices=["none", "optional", "required"],
                       help="client certificates on MQTT and AMQP TLS: a verified one logs in "
                       "as the user its CN names (default: none)")
    serve.add_argument("--native-tls", choices=["on", "off", "mixed"],
                       help="native gRPC port with a certificate: TLS only (default), "
                       "plaintext only, or both on one port")
    serve.add_argument("--advertised-host", metavar="HOST",
                       help="host native clients are told to connect to (default: the one they used)")
    serve.add_argument("--metadata-url", metavar="URL",
                       help="SQLAlchemy URL of the metadata database (default: SQLite in the data dir)")
    serve.add_argument("--allow-anonymous", action="store_true", default=None,
                       help="let clients without credentials connect (default: refuse them)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"],
                       help="least severe log lines written to stderr (default: info)")
    serve.add_argument("--log-format", choices=["text", "json"],
                       help="log lines as text, or one JSON object each (default: text)")
    cluster = serve.add_argument_group(
        "cluster", "Run as one node of a replica group on etcd (all three, plus [cluster] secret, "
        "the same on every node; `sluice serve --settings` lists the other cluster.* settings)")
    cluster.add_argument("--cluster-etcd", metavar="URL[,URL...]",
                         help="etcd client URLs, e.g. http://127.0.0.1:2379 (default: none, a single node)")
    cluster.add_argument("--node-id", metavar="NAME", help="this node's name in the group, stable across restarts")
    cluster.add_argument("--replication-port", type=int, metavar="PORT",
                         help="where followers fetch the log from this node while it leads (default: 5679)")
    serve.add_argument("--settings", action="store_true",
                       help="list every setting with its environment variable and default, and exit")
    serve.set_defaults(handler=_serve)


def _missing_data_dir(path: Path) -> int | None:
    """Print an error and return exit code 2 if `path` is not a directory, else return None."""
    if path.is_dir():
        return None
    problem = "is not a directory" if path.exists() else "does not exist"
    print(f"error: data directory {path} {problem}; pass the directory a broker wrote to "
          "(the one given to `sluice serve --data-dir DIR`).", file=sys.stderr)
    return 2


def _open_reader(path: Path):
    """A StoreReader over `path`, or None after printing why there is none."""
    if _missing_data_dir(path) is not None:
        return None
    from store.reader import StoreReader

    try:
        return StoreReader(str(path))
    except FileNotFoundError as error:
        print(f"error: {error}; pass the directory a broker wrote to.", file=sys.stderr)
        return None


def _store_inspect(args: argparse.Namespace) -> int:
    """Print the store's description as JSON."""
    if (reader := _open_reader(args.data_dir)) is None:
        return 2
    print(json.dumps(reader.describe(), indent=2, default=str))
    return 0


def _store_verify(args: argparse.Namespace) -> int:
    """Print every problem the store reader finds; exit 1 if there is any. A torn tail (what a
    crash leaves, cut at the next start) is printed but is no problem."""
    if (reader := _open_reader(args.data_dir)) is None:
        return 2
    found = reader.check()
    if found.torn_tail is not None:
        print(found.torn_tail)
    for problem in found.problems:
        print(problem)
    if found.problems:
        return 1
    print("ok")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser for `sluice` and its subcommands."""
    parser = argparse.ArgumentParser(prog="sluice", description="Sluice message broker.")
    parser.add_argument("--version", action="version", version=f"sluice {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_serve(commands)
    add_token_commands(commands, add_admin_commands(commands))
    add_client_commands(commands)
    add_cluster_commands(commands)
    add_vhost_commands(commands)
    add_push_commands(commands)
    add_tier_commands(commands)
    add_data_commands(commands)
    add_simulate_command(commands)
    add_analytics_commands(commands)
    add_demo_command(commands)
    add_dev_cert_command(commands)
    add_health_command(commands)

    store = commands.add_parser("store", help="Read an existing store offline.",
                                description="Read an existing store offline (no broker needed).")
    store_commands = store.add_subparsers(dest="store_command", required=True, metavar="COMMAND")
    subcommands: list[tuple[str, str, Callable[[argparse.Namespace], int]]] = [
        ("inspect", "Print a JSON description of the store.", _store_inspect),
        ("verify", "Check every record; print each problem and exit 1 if there is any.", _store_verify),
    ]
    for name, text, handler in subcommands:
        sub = store_commands.add_parser(name, help=text, description=text)
        sub.add_argument("data_dir", type=Path, metavar="DATA_DIR", help="the store's data directory")
        sub.set_defaults(handler=handler)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sluice")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse ``argv``; an unknown flag is reported with the usage of the subcommand it was
    given to (argparse would show the top-level usage, which does not list the flag's peers)."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _chosen(parser, args).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand parser ``args`` came from."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(args, action.dest, None)
            if name in action.choices:
                return _chosen(action.choices[name], args)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `sluice` command with `argv` (default: sys.argv[1:]) and return its exit code.

    Output piped into a reader that stops early (``sluice ... | head``) ends the command
    quietly, as other Unix tools do."""
    args = _parse(build_parser(), argv)
    try:
        code = args.handler(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python would report the pipe again when it flushes stdout at exit: point stdout at
        # /dev/null so that nothing is left to flush.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the pipe

