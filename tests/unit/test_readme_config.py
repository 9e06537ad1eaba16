"""The configuration examples of the docs load: every key they show exists, every value is valid.

docs/configuration.md holds the full file (its first ``toml`` block); other pages show parts
of one (MQTT's ``topic_map``, a cluster node's ``[cluster]``)."""
from __future__ import annotations

from sluice.server.config import load_config
from tests.readme import every_block


def test_the_full_configuration_example_loads_with_the_defaults_it_states(tmp_path):
    full = next(block for block in every_block()
                if block.language == "toml" and block.page == "docs/configuration.md")
    path = tmp_path / "sluice.toml"
    path.write_text(full.code)
    config = load_config(path)
    assert config.core.offset_commit_interval_ms == 1000 and config.native.port == 8081
    assert config.store.flush == "sync" and config.auth.default_user == "sluice"
    assert config.amqp.port == 5672 and config.amqp.guest_from_loopback


def test_every_configuration_snippet_on_every_page_loads(tmp_path):
    snippets = [block for block in every_block() if block.language == "toml"]
    assert {block.page for block in snippets} >= {"docs/configuration.md", "docs/mqtt.md",
                                                  "docs/clustering.md"}
    for block in snippets:
        path = tmp_path / "sluice.toml"
        path.write_text(block.code)
        load_config(path)
