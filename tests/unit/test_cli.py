"""The `sluice` command line: offline store inspection and verification."""
from __future__ import annotations

import json

import pytest

from sluice.cli import main
from store.api import StoreConfig
from store.file_store import FileStore


@pytest.fixture
def data_dir(tmp_path):
    path = tmp_path / "data"
    with FileStore(str(path), StoreConfig(segment_size=1024)) as store:
        results = [store.append("devices", b"reading %d" % i, queue_id=i % 2) for i in range(40)]
        store.wait_durable(results[-1].end_offset, 10)
    return path


def test_inspect_prints_every_queue_as_json(data_dir, capsys):
    assert main(["store", "inspect", str(data_dir)]) == 0
    described = json.loads(capsys.readouterr().out)
    assert {(q["topic"], q["queue_id"], q["max_offset"]) for q in described["queues"]} == {
        ("devices", 0, 20), ("devices", 1, 20)}
    assert described["commit_log"]["segments"] > 1


def test_verify_says_ok_on_a_sound_store_and_names_a_corrupt_segment(data_dir, capsys):
    assert main(["store", "verify", str(data_dir)]) == 0
    assert capsys.readouterr().out.strip() == "ok"
    first = sorted((data_dir / "commitlog").iterdir())[0]
    raw = bytearray(first.read_bytes())
    raw[100] ^= 0xFF
    first.write_bytes(bytes(raw))
    assert main(["store", "verify", str(data_dir)]) == 1
    assert first.name in capsys.readouterr().out


def test_a_missing_or_foreign_directory_gets_a_clear_error(tmp_path, capsys):
    assert main(["store", "verify", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["store", "inspect", str(tmp_path)]) == 2
    assert "holds no Sluice store" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["store", "--help"],
                                  ["store", "inspect", "--help"], ["store", "verify", "--help"]])
def test_every_command_has_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 0
    assert "usage: sluice" in capsys.readouterr().out


def leaf_commands(parser, prefix=()):
    """Every runnable command path of the parser, e.g. ('topic', 'create')."""
    import argparse

    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield prefix
        return
    for name, sub in subparsers[0].choices.items():
        yield from leaf_commands(sub, (*prefix, name))


def test_every_leaf_command_has_help(capsys):
    from sluice.cli.main import build_parser

    leaves = list(leaf_commands(build_parser()))
    for expected in [("serve",), ("topic", "create"), ("group", "reset-offset"), ("message", "get"), ("message", "find"),
                     ("user", "grant"), ("send",), ("consume",), ("store", "verify")]:
        assert expected in leaves
    for leaf in leaves:
        with pytest.raises(SystemExit) as exit_info:
            main([*leaf, "--help"])
        assert exit_info.value.code == 0, leaf
        assert f"usage: sluice {' '.join(leaf)}" in capsys.readouterr().out


def test_admin_and_data_commands_default_to_local_endpoints_and_env_credentials(monkeypatch):
    from sluice.cli.main import build_parser

    monkeypatch.setenv("SLUICE_USER", "ops")
    monkeypatch.delenv("SLUICE_PASSWORD", raising=False)
    args = build_parser().parse_args(["topic", "list"])
    assert (args.admin, args.user, args.password) == ("http://127.0.0.1:8080", "ops", "sluice")
    args = build_parser().parse_args(["send", "orders", "hi", "--count", "5"])
    assert (args.server, args.count, args.body) == ("127.0.0.1:8081", 5, "hi")


def test_serve_flags_override_only_what_is_given(monkeypatch):
    from sluice.cli.main import SERVE_FLAGS, build_parser
    from sluice.server.config import load_config

    args = build_parser().parse_args(["serve", "--native-port", "9999", "--flush", "async"])
    config = load_config(None, {"SLUICE_NATIVE_PORT": "1", "SLUICE_ADMIN_PORT": "2"},
                         {path: getattr(args, dest) for dest, path in SERVE_FLAGS.items()})
    assert (config.native.port, config.admin.port, config.store.flush) == (9999, 2, "async")
    assert config.auth.allow_anonymous is False


def test_consume_needs_a_group_or_a_start_offset(capsys):
    assert main(["consume", "orders"]) == 2
    assert "--group G" in capsys.readouterr().err
    assert main(["consume", "orders", "--group", "g", "--earliest"]) == 2
    assert "pick one" in capsys.readouterr().err


def test_a_bad_reset_time_is_a_usage_error():
    from sluice.cli.admin import CliError, parse_time

    assert parse_time("1700000000000") == 1_700_000_000_000
    assert parse_time("2024-01-01T00:00:00+00:00") == 1_704_067_200_000
    with pytest.raises(CliError, match="ISO"):
        parse_time("yesterday")


def test_printed_metadata_urls_hide_the_password():
    from sluice.server.app import masked

    assert masked("postgresql+psycopg://sluice:s3cr3t@db:5432/sluice") == \
        "postgresql+psycopg://sluice:***@db:5432/sluice"
    assert masked("sqlite:////var/lib/sluice/metadata.db") == "sqlite:////var/lib/sluice/metadata.db"


def test_serve_lists_every_setting_with_its_environment_variable(capsys):
    from sluice.cli import main
    from sluice.server.config import leaf_paths
    assert main(["serve", "--settings"]) == 0
    printed = capsys.readouterr().out
    assert "SLUICE_NATIVE_PORT" in printed and "store.flush " in printed
    assert all(path in printed for path in leaf_paths())


def test_version_names_the_installed_release(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"sluice {version('sluice')}"


@pytest.mark.parametrize("argv, usage, unknown", [
    (["topic", "list", "--bogus"], "usage: sluice topic list", "--bogus"),
    (["send", "orders", "x", "--countt", "3"], "usage: sluice send", "--countt 3"),
    (["serve", "--nope"], "usage: sluice serve", "--nope"),
])
def test_a_wrong_flag_shows_the_usage_of_its_subcommand(argv, usage, unknown, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and f"unrecognized arguments: {unknown}" in err


def test_output_into_a_closed_pipe_ends_without_a_traceback():
    """`sluice ... | head` where head has already exited: no BrokenPipeError report."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "sluice.cli", "serve", "--settings"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert done.returncode == 141
    assert done.stderr == ""
