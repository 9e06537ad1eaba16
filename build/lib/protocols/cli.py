"""The `sluice` command: the composition root that will start every protocol adapter over one core."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

DEFAULT_DATA_DIR = "./data"


def _serve(args: argparse.Namespace) -> int:
    """Report that this version has no protocol listener yet, and which data directory it would use."""
    print("sluice: no protocol listener exists yet in this version; "
          "MQTT, AMQP and native gRPC arrive in later releases.")
    print(f"data directory it would use: {args.data_dir.resolve()}")
    return 0


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
    """Print every problem the store reader finds; exit 1 if there is any."""
    if (reader := _open_reader(args.data_dir)) is None:
        return 2
    problems: list[str] = reader.verify()
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print("ok")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser for `sluice` and its subcommands."""
    parser = argparse.ArgumentParser(prog="sluice", description="Sluice message broker.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="Run the broker.", description="Run the broker.")
    serve.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, metavar="DIR",
                       help="directory holding the store (default: %(default)s)")
    serve.set_defaults(handler=_serve)

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


def main(argv: list[str] | None = None) -> int:
    """Run the `sluice` command with `argv` (default: sys.argv[1:]) and return its exit code."""
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
