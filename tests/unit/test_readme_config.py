"""The configuration examples in README.md load: every key they show exists, every value is valid."""
from __future__ import annotations

import re
from pathlib import Path

from sluice.server.config import load_config

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_config_examples_load(tmp_path):
    full, *snippets = re.findall(r"```toml\n(.*?)```", README.read_text(), re.S)
    path = tmp_path / "sluice.toml"
    path.write_text(full)
    config = load_config(path)
    assert config.core.offset_commit_interval_ms == 1000 and config.native.port == 8081
    assert config.store.flush == "sync" and config.auth.default_user == "sluice"
    assert config.amqp.port == 5672 and config.amqp.guest_from_loopback
    for snippet in snippets:
        path.write_text(snippet)
        load_config(path)
