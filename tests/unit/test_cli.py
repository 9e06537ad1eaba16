"""The `sluice` command line: offline store inspection and verification."""
from __future__ import annotations

import json

import pytest

from protocols.cli import main
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
