"""The broker configuration: defaults, TOML file, SLUICE_* environment, CLI overrides."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from sluice.server.config import (TOOL_VARIABLES, Config, ConfigError, core_settings, deprecation_warnings,
                                  describe_sources, env_name, leaf_paths, load_config,
                                  unknown_variables)


def write(tmp_path, text: str):
    path = tmp_path / "sluice.toml"
    path.write_text(text)
    return path


def test_defaults_bind_loopback_on_the_documented_ports():
    config = load_config()
    assert config == Config()
    assert (config.native.host, config.native.port) == ("127.0.0.1", 8081)
    assert (config.admin.host, config.admin.port) == ("127.0.0.1", 8080)
    assert config.store.flush == "sync"
    assert config.auth.allow_anonymous is False
    assert (config.auth.default_user, config.auth.default_password) == ("sluice", "sluice")
    assert config.metadata_url is None


def test_a_message_body_is_at_most_rabbitmq_4s_default_and_half_a_store_segment():
    assert core_settings(load_config()).max_message_bytes == 16 << 20
    small = load_config(overrides={"store.segment_size": 4 << 20})
    assert core_settings(small).max_message_bytes == 2 << 20  # a record must fit a segment
    lowered = load_config(overrides={"core.max_message_bytes": 1024})
    assert core_settings(lowered).max_message_bytes == 1024


def test_the_tree_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().native.port = 1  # type: ignore[misc]


def test_file_values_land_in_their_sections(tmp_path):
    path = write(tmp_path, """
        data_dir = "/var/lib/sluice"
        metadata_url = "postgresql+psycopg://u:p@db/sluice"
        [store]
        flush = "async"
        flush_interval_ms = 50
        retention_max_age_ms = 86_400_000
        [core]
        max_message_bytes = 1024
        [native]
        port = 9081
        advertised_host = "broker.example"
        [admin]
        host = "0.0.0.0"
        [auth]
        allow_anonymous = true
    """)
    config = load_config(path)
    assert config.data_dir == "/var/lib/sluice"
    assert config.metadata_url.startswith("postgresql")
    assert (config.store.flush, config.store.flush_interval_ms) == ("async", 50)
    assert config.store.retention_max_age_ms == 86_400_000
    assert config.core.max_message_bytes == 1024
    assert (config.native.port, config.native.advertised_host) == (9081, "broker.example")
    assert config.admin.host == "0.0.0.0" and config.admin.port == 8080
    assert config.auth.allow_anonymous is True


def test_environment_beats_file_and_flags_beat_environment(tmp_path):
    path = write(tmp_path, "[native]\nport = 1111\n[store]\nflush = 'async'\n")
    env = {"SLUICE_NATIVE_PORT": "2222", "SLUICE_STORE_FLUSH": "sync", "SLUICE_ADMIN_PORT": "3333"}
    config = load_config(path, env, {"native.port": 4444, "admin.port": None})
    assert config.native.port == 4444          # flag
    assert config.store.flush == "sync"       # env over file
    assert config.admin.port == 3333          # unset flag changes nothing


def test_environment_values_are_parsed_by_type():
    env = {"SLUICE_AUTH_ALLOW_ANONYMOUS": "yes", "SLUICE_STORE_RETENTION_MAX_BYTES": "1_000_000",
           "SLUICE_METADATA_URL": "sqlite:///m.db", "SLUICE_CORE_AUTO_CREATE_GROUPS": "off"}
    config = load_config(env=env)
    assert config.auth.allow_anonymous is True
    assert config.store.retention_max_bytes == 1_000_000
    assert config.metadata_url == "sqlite:///m.db"
    assert config.core.auto_create_groups is False
    assert load_config(env={"SLUICE_STORE_RETENTION_MAX_BYTES": ""}).store.retention_max_bytes is None


def test_host_sets_every_listener_and_a_listener_host_wins_over_it():
    config = load_config(env={"SLUICE_HOST": "0.0.0.0", "SLUICE_ADMIN_HOST": "10.0.0.1"})
    assert (config.native.host, config.admin.host) == ("0.0.0.0", "10.0.0.1")
    assert load_config(overrides={"host": "::1"}).admin.host == "::1"


def test_unrelated_sluice_variables_are_ignored():
    assert load_config(env={"SLUICE_USER": "bob", "SLUICE_PASSWORD": "x", "HOME": "/"}) == Config()


def test_an_unknown_key_is_named_with_the_known_ones(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, "[store]\nflsuh = 'sync'\n"))
    message = str(error.value)
    assert "unknown key 'store.flsuh'" in message and "flush_interval_ms" in message
    assert "sluice.toml" in message
    with pytest.raises(ConfigError, match="unknown key 'colour'.*top level"):
        load_config(write(tmp_path, "colour = 'blue'\n"))
    with pytest.raises(ConfigError, match="unknown key 'amqp.prot'.*guest_from_loopback"):
        load_config(write(tmp_path, "[amqp]\nprot = 5672\n"))


def test_amqp_is_configured_in_its_own_section(tmp_path):
    config = load_config(write(tmp_path, "[amqp]\nport = 5673\nheartbeat_s = 30\n"
                                         "guest_from_loopback = false\n"),
                         env={"SLUICE_AMQP_FRAME_MAX": "65536"}, overrides={"host": "0.0.0.0"})
    amqp = config.amqp
    assert (amqp.port, amqp.heartbeat_s, amqp.frame_max, amqp.host) == (5673, 30, 65536, "0.0.0.0")
    assert not amqp.guest_from_loopback and amqp.max_message_size == 16 << 20
    assert load_config(overrides={"amqp.port": -1}).amqp.port == -1
    with pytest.raises(ConfigError, match="amqp.port = -2 is out of range"):
        load_config(overrides={"amqp.port": -2})
    with pytest.raises(ConfigError, match="frame_max must be at least 4096"):
        load_config(overrides={"amqp.frame_max": 100})


def test_mqtt_listeners_are_configured_in_their_own_section(tmp_path):
    config = load_config(write(tmp_path, "[mqtt]\nport = 1884\nws_port = -1\n"),
                         env={"SLUICE_MQTT_TLS_PORT": "0"})
    assert (config.mqtt.port, config.mqtt.ws_port, config.mqtt.tls_port) == (1884, -1, 0)
    with pytest.raises(ConfigError, match="mqtt.ws_port = -2 is out of range"):
        load_config(overrides={"mqtt.ws_port": -2})
    with pytest.raises(ConfigError, match="tls_cert and mqtt.tls_key must be set together"):
        load_config(overrides={"mqtt.tls_cert": "cert.pem"})


@pytest.mark.parametrize("text, fragment", [
    ("[store]\nflush = 'sometimes'\n", "store.flush = 'sometimes' is not one of 'sync', 'async'"),
    ("[native]\nport = 'eighty'\n", "native.port = 'eighty' should be a whole number"),
    ("[native]\nport = 70000\n", "native.port = 70000 is out of range"),
    ("[auth]\nallow_anonymous = 1\n", "auth.allow_anonymous = 1 should be true or false"),
    ("native = 3\n", "'native' must be a table"),
    ("[admin]\nport = 8081\n", "give each listener its own port"),
    ("[store]\nflush_interval_ms = 0\n", "store.flush_interval_ms = 0 must be greater than 0"),
    ("[store\n", "not valid TOML"),
])
def test_bad_values_name_the_key(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, text))
    assert fragment in str(error.value)


def test_bad_environment_values_name_the_variable():
    with pytest.raises(ConfigError, match="SLUICE_NATIVE_PORT='x': expected a whole number"):
        load_config(env={"SLUICE_NATIVE_PORT": "x"})
    with pytest.raises(ConfigError, match="SLUICE_AUTH_ALLOW_ANONYMOUS='maybe'"):
        load_config(env={"SLUICE_AUTH_ALLOW_ANONYMOUS": "maybe"})
    with pytest.raises(ConfigError, match="SLUICE_STORE_FLUSH.*not one of"):
        load_config(env={"SLUICE_STORE_FLUSH": "never"})


def test_a_missing_file_says_how_to_fix_it(tmp_path):
    with pytest.raises(ConfigError, match="does not exist.*--config"):
        load_config(tmp_path / "nope.toml")


def test_an_unknown_override_is_an_error():
    with pytest.raises(ConfigError, match="unknown setting 'store.colour'"):
        load_config(overrides={"store.colour": "red"})


def test_every_leaf_has_an_environment_variable_and_a_default():
    rows = describe_sources()
    assert [r[0] for r in rows] == list(leaf_paths())
    assert ("native.port", "SLUICE_NATIVE_PORT", "8081") in rows
    assert env_name("store.flush_interval_ms") == "SLUICE_STORE_FLUSH_INTERVAL_MS"


def test_a_misspelled_variable_is_named_with_the_closest_known_one():
    warnings = unknown_variables({"SLUICE_CORE_MESAGE_TRACE": "true", "SLUICE_FLUSH": "async",
                                  "SLUICE_ADMIN_URLS": "x", "SLUICE_ZZZ": "1", "HOME": "/root"})
    assert warnings == [
        "environment variable SLUICE_ADMIN_URLS is not a Sluice setting and is ignored; did you "
        "mean SLUICE_ADMIN_URL?",
        "environment variable SLUICE_CORE_MESAGE_TRACE is not a Sluice setting and is ignored; "
        "did you mean SLUICE_CORE_MESSAGE_TRACE?",
        "environment variable SLUICE_FLUSH is not a Sluice setting and is ignored; did you mean "
        "SLUICE_STORE_FLUSH?",
        "environment variable SLUICE_ZZZ is not a Sluice setting and is ignored; `sluice serve "
        "--settings` lists every setting's variable"]


def test_settings_and_the_tools_own_variables_are_not_warned_about():
    known = {env_name(dotted): "1" for dotted in leaf_paths()}
    assert unknown_variables({**known, **dict.fromkeys(TOOL_VARIABLES, "x"), "SLUICE_HOST": "::"}) == []


def test_every_sluice_variable_the_repository_reads_is_known():
    """A new SLUICE_* variable (a test's, a tool's) must be a setting or listed in
    TOOL_VARIABLES, or `sluice serve` would warn about it."""
    root = Path(__file__).resolve().parents[2]
    sources = [p for folder in ("sluice", "core", "store", "protocols", "analytics", "bench",
                                "tests", ".ci") for p in (root / folder).rglob("*")
               if p.is_file() and p.suffix in (".py", ".sh", "") and "__pycache__" not in p.parts]
    named = {name for path in sources
             for name in re.findall(r"\bSLUICE_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(errors="replace"))}
    named -= {"SLUICE_CORE_MESAGE_TRACE", "SLUICE_ADMIN_URLS", "SLUICE_ZZZ", "SLUICE_FLUSH"}  # typos above
    settings = {env_name(dotted) for dotted in leaf_paths()} | {"SLUICE_HOST"}
    assert named - settings - set(TOOL_VARIABLES) == set()


def test_cluster_settings_come_from_flags_and_environment_and_name_what_is_missing():
    env = {"SLUICE_CLUSTER_SECRET": "s", "SLUICE_CLUSTER_MIN_INSYNC": "3"}
    config = load_config(None, env, {"cluster.etcd": "http://127.0.0.1:2379,http://127.0.0.2:2379",
                                     "cluster.node_id": "n1", "cluster.replication_port": 6000, "host": "127.0.0.2"})
    cluster = config.cluster
    assert cluster.enabled and cluster.endpoints == ["http://127.0.0.1:2379", "http://127.0.0.2:2379"]
    assert (cluster.node_id, cluster.min_insync, cluster.replication_port, cluster.host) == ("n1", 3, 6000, "127.0.0.2")
    assert core_settings(config).replicated_state, "a node of a group keeps its state in the log"
    assert not core_settings(load_config(None, {})).replicated_state
    with pytest.raises(ConfigError, match="--node-id"):
        load_config(None, {"SLUICE_CLUSTER_ETCD": "http://127.0.0.1:2379", "SLUICE_CLUSTER_SECRET": "s"})
    with pytest.raises(ConfigError, match="secret"):
        load_config(None, {"SLUICE_CLUSTER_ETCD": "http://127.0.0.1:2379", "SLUICE_CLUSTER_NODE_ID": "n1"})
    with pytest.raises(ConfigError, match="etcd client URL"):
        load_config(None, {"SLUICE_CLUSTER_ETCD": "127.0.0.1", "SLUICE_CLUSTER_NODE_ID": "n1",
                           "SLUICE_CLUSTER_SECRET": "s"})


def test_the_tls_section_is_one_certificate_for_every_listener(tmp_path):
    config = load_config(write(tmp_path, '[tls]\ncert = "c.pem"\nkey = "k.pem"\n'
                                         'client_ca = "ca.pem"\nclient_certs = "required"\n'),
                         env={"SLUICE_NATIVE_TLS": "mixed", "SLUICE_ADMIN_TLS": "false"})
    assert (config.tls.cert, config.tls.key, config.tls.client_ca) == ("c.pem", "k.pem", "ca.pem")
    assert config.tls.verifies_clients and config.native.tls == "mixed" and not config.admin.tls
    assert deprecation_warnings(config) == []
    flags = load_config(overrides={"tls.cert": "a.pem", "tls.key": "b.pem"})
    assert flags.tls.enabled and flags.native.tls == "on" and flags.admin.tls


def test_mqtt_tls_cert_still_works_with_a_warning_naming_the_new_key():
    config = load_config(env={"SLUICE_MQTT_TLS_CERT": "c.pem", "SLUICE_MQTT_TLS_KEY": "k.pem"})
    assert (config.tls.cert, config.tls.key) == ("c.pem", "k.pem")
    warnings = deprecation_warnings(config)
    assert len(warnings) == 2 and "write tls.cert" in warnings[0] and "SLUICE_TLS_CERT" in warnings[0]
    with pytest.raises(ConfigError, match="name different files; remove mqtt.tls_cert"):
        load_config(overrides={"mqtt.tls_cert": "c.pem", "mqtt.tls_key": "k.pem",
                               "tls.cert": "other.pem", "tls.key": "k.pem"})


@pytest.mark.parametrize("overrides, fragment", [
    ({"tls.cert": "c.pem"}, "tls.cert and tls.key must be set together"),
    ({"tls.client_certs": "optional"}, "needs a server certificate"),
    ({"tls.cert": "c.pem", "tls.key": "k.pem", "tls.client_certs": "required"},
     "needs tls.client_ca"),
    ({"tls.client_certs": "sometimes"}, "is not one of 'none', 'optional', 'required'"),
    ({"native.tls": "both"}, "is not one of 'on', 'off', 'mixed'"),
])
def test_a_tls_setting_that_cannot_work_is_an_error_saying_what_to_set(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(overrides=overrides)
