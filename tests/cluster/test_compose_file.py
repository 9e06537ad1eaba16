"""docker/compose.cluster.yml and docker/Dockerfile, checked and run without a container engine
(test_container_engine.py builds and runs the image itself; Compose is not run anywhere).

What is checked: the Dockerfile's settings (a non-root image, its data on a volume, the standard
ports exposed, `sluice` as entrypoint); that the build context .dockerignore leaves makes a
wheel with the `sluice` command; that the compose file's three etcd members describe one
initial cluster and its three Sluice nodes share every cluster setting but their name, host and
volume, with the secret required; and then the compose file's own commands run as real
processes: each etcd service's command with its flags, and each Sluice service's environment
and command on top of the image's ENV and ENTRYPOINT, every service on a loopback address of its
own (127.0.0.31.. for etcd, 127.0.0.41.. for Sluice) standing for its name on the compose
network, and every container port moved to a free port. The three etcd members must form one
cluster of three, the nodes must elect a leader that `sluice cluster status` (as `docker compose
exec` runs it) and the image's HEALTHCHECK see, and a message confirmed through one follower
must be read back through the other.

The mapping changes only addresses, ports and the volume paths; a wrong flag, member list, etcd
URL, node id or host in the compose file makes the processes fail to form the group.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
import zipfile
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import yaml

from bench.cluster_load import cluster_view, wait_for
from bench.processes import free_ports
from sluice.cli.dev_cluster import NodeProcess, Ports
from sluice.cluster.local_etcd import dying_with_parent, find_etcd
from sluice.client import ClientConfig, Message, SluiceClientError, SyncProducer, SyncSimpleConsumer
from sluice.server.config import load_config, unknown_variables
from tests.integration.test_metrics_reference import CLUSTER_SECTION, check_against_reference, scrape

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker" / "compose.cluster.yml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
ETCD_IMAGE = "quay.io/coreos/etcd:"
SECRET = "compose-file-test-secret"
FIRST_ETCD_ADDRESS, FIRST_NODE_ADDRESS = 31, 41
"""Loopback addresses standing for the services (127.0.0.2-4 and .12-14 are the other cluster tests')."""
STANDARD = Ports()
"""The ports every node listens on, in the image as on a machine."""
PORT_FLAGS = {"native": "--native-port", "admin": "--admin-port", "mqtt": "--mqtt-port",
              "mqtt_ws": "--mqtt-ws-port", "amqp": "--amqp-port", "replication": "--replication-port"}
ETCD_PORTS = (2379, 2380)
WAIT_S = 45.0
"""Guards against hanging only."""
SERVICE_KEYS = {"image", "build", "restart", "stop_grace_period", "depends_on", "hostname", "command",
                "environment", "volumes", "ports", "healthcheck", "entrypoint", "user", "networks"}
"""Compose service keys this file may use: a misspelt key (which Compose would refuse) fails here."""


# -- reading the files --------------------------------------------------------------------------

class MissingVariable(ValueError):
    """A ``${NAME:?message}`` whose variable is unset: Compose refuses to start."""


_VARIABLE = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def interpolate(value, env: dict[str, str]):
    """Compose's variable interpolation (``$$``, ``$NAME``, ``${NAME}``, ``${NAME:-default}``,
    ``${NAME-default}``, ``${NAME:?error}``, ``${NAME?error}``) over a loaded YAML tree."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        if match.group(1):
            return "$"
        name = match.group(2) or match.group(5)
        operator, argument = match.group(3), match.group(4)
        if operator is None:
            return env.get(name, "")
        present = name in env and (env[name] != "" or not operator.startswith(":"))
        if operator.endswith("-"):
            return env[name] if present else argument
        if not present:
            raise MissingVariable(f"{name}: {argument}")
        return env[name]
    return _VARIABLE.sub(one, value)


def compose_raw() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def compose(env: dict[str, str] | None = None) -> dict:
    """The compose file as Compose sees it with ``env`` in the shell (the secret set by default)."""
    return interpolate(compose_raw(), {"SLUICE_CLUSTER_SECRET": SECRET} if env is None else env)


def dockerfile(path: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) in order, continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        keyword, _, rest = (pending + line).strip().partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    return instructions


def instruction(name: str, path: Path = DOCKERFILE) -> list[str]:
    return [rest for keyword, rest in dockerfile(path) if keyword == name]


def base_image(path: Path = DOCKERFILE) -> str:
    """The FROM image, its ``${ARG}`` replaced by the ARG's default."""
    defaults = dict(rest.partition("=")[::2] for rest in instruction("ARG", path) if "=" in rest)
    [image] = instruction("FROM", path)
    return interpolate(image, defaults)


def image_env(path: Path = DOCKERFILE) -> dict[str, str]:
    """The image's ENV, ``$NAME`` in a value read as the base image's (here: this machine's)."""
    env: dict[str, str] = {}
    for rest in instruction("ENV", path):
        for word in shlex.split(rest):
            key, equals, value = word.partition("=")
            assert equals, f"ENV {rest!r}: write KEY=value"
            env[key] = interpolate(value, {**os.environ, **env})
    return env


def exec_form(text: str) -> list[str]:
    form = json.loads(text)
    assert isinstance(form, list) and all(isinstance(word, str) for word in form), text
    return form


def healthcheck(path: Path = DOCKERFILE) -> list[str]:
    """The HEALTHCHECK's command (exec form)."""
    [rest] = instruction("HEALTHCHECK", path)
    options, marker, command = rest.partition(" CMD ")
    assert marker, f"HEALTHCHECK without CMD: {rest!r}"
    return exec_form(command)


def as_run_here(command: list[str]) -> list[str]:
    """A container's ``sluice ...`` command (the image's venv first on PATH) as this
    interpreter runs it."""
    assert command[0] == "sluice", f"the image runs `sluice`, not {command[0]!r}"
    return [sys.executable, "-m", "sluice.cli", *command[1:]]


def image_volume(path: Path = DOCKERFILE) -> str:
    [rest] = instruction("VOLUME", path)
    volumes = exec_form(rest) if rest.startswith("[") else rest.split()
    assert len(volumes) == 1, volumes
    return volumes[0]


def etcd_services(services: dict) -> dict[str, dict]:
    return {name: service for name, service in services.items() if service.get("image", "").startswith(ETCD_IMAGE)}


def sluice_services(services: dict) -> dict[str, dict]:
    return {name: service for name, service in services.items()
            if (service.get("build") or {}).get("dockerfile") == "docker/Dockerfile"}


def flags(command: list[str]) -> dict[str, str]:
    """``--name=value`` and ``--name value`` arguments after the program, by name."""
    found, words = {}, command[1:]
    index = 0
    while index < len(words):
        word = words[index]
        assert word.startswith("--"), f"not a flag: {word!r} in {command}"
        key, equals, value = word.partition("=")
        if not equals:
            value, index = words[index + 1], index + 1
        assert key not in found, f"{key} given twice in {command}"
        found[key] = value
        index += 1
    return found


def urls(text: str) -> list[str]:
    return [url.strip() for url in text.split(",") if url.strip()]


def host_port(url: str) -> tuple[str, int]:
    match = re.fullmatch(r"http://([^:/]+):(\d+)/?", url)
    assert match, f"not an http://host:port URL: {url!r}"
    return match.group(1), int(match.group(2))


def volume(service: dict) -> tuple[str, str]:
    """(named volume, where it is mounted) of a service with one volume."""
    [mount] = service["volumes"]
    name, _, target = mount.partition(":")
    return name, target


# -- the image ----------------------------------------------------------------------------------

def test_the_dockerfile_builds_a_non_root_sluice_image_with_its_data_on_a_volume():
    assert base_image() == "python:3.11-slim-bookworm"
    [run] = [rest for rest in instruction("RUN") if "pip install" in rest]
    assert "python3 -m venv /opt/sluice" in run and "pip install --no-cache-dir ." in run
    assert image_env()["PATH"].startswith("/opt/sluice/bin:"), "the venv's sluice and python first"
    [user] = instruction("USER")
    assert user == "sluice" and re.search(r"useradd .*\bsluice\b", run), "a non-root user sluice runs it"
    env = image_env()
    assert image_volume() == env["SLUICE_DATA_DIR"] == "/var/lib/sluice"
    assert not unknown_variables(env), unknown_variables(env)
    assert load_config(env=env).data_dir == "/var/lib/sluice"
    exposed = {int(port) for rest in instruction("EXPOSE") for port in rest.split()}
    config = load_config(env=env)
    tls = {config.mqtt.tls_port, config.mqtt.wss_port, config.amqp.tls_port}
    assert exposed == set(dataclasses.asdict(STANDARD).values()) | tls
    assert instruction("STOPSIGNAL") == ["SIGTERM"]
    [entrypoint] = instruction("ENTRYPOINT")
    assert exec_form(entrypoint) == ["sluice"]
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["sluice"] == "sluice.cli:main"
    [cmd] = instruction("CMD")
    assert exec_form(cmd) == ["serve", "--host", "0.0.0.0"]  # alone: every address of the container
    assert healthcheck() == ["sluice", "health"], "the admin API's /health, over HTTPS with a certificate"


def _ignored(relative: str, patterns: list[str]) -> bool:
    """Whether Docker's .dockerignore ``patterns`` leave the path out of the build context (it or
    any folder above it matching; the forms used here: a name or glob at the root, ``**/name``)."""
    parts = relative.split("/")
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatchcase(part, pattern[3:]) for part in parts):
                return True
        elif fnmatchcase(parts[0], pattern):
            return True
    return False


def build_context(context: Path) -> Path:
    """A copy of the repository's files (git's view) less what .dockerignore leaves out."""
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode().split("\0")
    for relative in filter(None, tracked):
        source = ROOT / relative
        if not _ignored(relative, patterns) and source.is_file():
            (context / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, context / relative)
    return context


def test_the_build_context_left_by_dockerignore_makes_a_wheel_with_the_sluice_command(tmp_path):
    patterns = [line.strip() for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    for pattern in patterns:
        assert not pattern.startswith("!") and "/" not in pattern.removeprefix("**/"), \
            f"{pattern!r}: _ignored knows only root names and **/name"
    for kept_out in (".git", ".venv", "data", "cluster-data", "sluice.egg-info", "sluice/__pycache__/x.pyc"):
        assert _ignored(kept_out, patterns), kept_out
    context = build_context(tmp_path / "context")
    # the Dockerfile's `pip install .`, less fetching the dependencies
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--no-cache-dir", "--wheel-dir", str(tmp_path / "wheels"), str(context)], check=True, timeout=300)
    [wheel] = (tmp_path / "wheels").glob("sluice-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [entry_points] = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
        assert "sluice = sluice.cli:main" in archive.read(entry_points).decode()
    for module in ("sluice/cli/main.py", "sluice/server/cluster_node.py", "store/api.py", "core/engine.py",
                   "protocols/native/server.py"):
        assert module in names, module
    assert any(name.startswith("analytics/dashboard/") for name in names)


# -- the compose file, read ---------------------------------------------------------------------

def test_the_secret_must_be_given():
    raw = compose_raw()
    for name, service in sluice_services(raw["services"]).items():
        assert re.fullmatch(r"\$\{SLUICE_CLUSTER_SECRET:\?.+\}", service["environment"]["SLUICE_CLUSTER_SECRET"]), name
    with pytest.raises(MissingVariable, match="SLUICE_CLUSTER_SECRET"):
        compose({})
    with pytest.raises(MissingVariable, match="SLUICE_CLUSTER_SECRET"):
        compose({"SLUICE_CLUSTER_SECRET": ""})


def test_three_etcd_members_form_one_initial_cluster():
    services = compose()["services"]
    members = etcd_services(services)
    assert len(members) == 3
    assert set(services) == set(members) | set(sluice_services(services))
    clusters, tokens, volumes = set(), set(), set()
    for name, service in members.items():
        assert set(service) <= SERVICE_KEYS, set(service) - SERVICE_KEYS
        assert service["hostname"] == name and service["restart"] == "unless-stopped"
        command = service["command"]
        assert Path(command[0]).name == "etcd"
        given = flags(command)
        assert given["--name"] == name
        peer, client = given["--initial-advertise-peer-urls"], given["--advertise-client-urls"]
        assert host_port(peer) == (name, ETCD_PORTS[1]) and host_port(client) == (name, ETCD_PORTS[0])
        assert host_port(given["--listen-peer-urls"])[1] == ETCD_PORTS[1]
        assert host_port(given["--listen-client-urls"])[1] == ETCD_PORTS[0]
        assert given["--initial-cluster-state"] == "new"
        cluster = dict(member.split("=", 1) for member in given["--initial-cluster"].split(","))
        assert cluster[name] == peer
        clusters.add(tuple(sorted(cluster.items())))
        tokens.add(given.get("--initial-cluster-token"))
        named, target = volume(service)
        assert given["--data-dir"] == target and named in compose()["volumes"]
        volumes.add(named)
    assert len(clusters) == 1 and len(tokens) == 1 and len(volumes) == 3
    [cluster] = clusters
    assert {member for member, _ in cluster} == set(members), "the initial cluster names every member"


def test_every_node_has_the_same_cluster_settings_but_its_own_name_host_and_volume():
    raw = compose()
    services, members = raw["services"], etcd_services(raw["services"])
    nodes = sluice_services(services)
    assert len(nodes) == 3
    client_urls = [flags(member["command"])["--advertise-client-urls"] for member in members.values()]
    own = {"SLUICE_CLUSTER_NODE_ID", "SLUICE_ADMIN_URL"}
    shared = []
    published: list[int] = []
    for name, service in nodes.items():
        assert set(service) <= SERVICE_KEYS, set(service) - SERVICE_KEYS
        env = service["environment"]
        shared.append({key: value for key, value in env.items() if key not in own}
                      | {key: service[key] for key in ("image", "build", "restart", "depends_on")})
        assert env["SLUICE_CLUSTER_NODE_ID"] == name == service["hostname"]
        assert service["command"] == ["serve", "--host", name], "every listener on the name the peers resolve"
        assert env["SLUICE_ADMIN_URL"] == f"http://{name}:{STANDARD.admin}"
        assert sorted(urls(env["SLUICE_CLUSTER_ETCD"])) == sorted(client_urls)
        assert not [key for key in env if key.endswith(("_PORT", "_HOST", "DATA_DIR"))], \
            "the nodes use the image's ports and data dir (EXPOSE, VOLUME)"
        assert set(members) <= set(service["depends_on"]) and service["restart"] == "unless-stopped"
        named, target = volume(service)
        assert target == image_volume() and named in raw["volumes"]
        config = load_config(env=image_env() | env, overrides={"host": name})
        assert config.cluster.node_id == name and config.cluster.secret == SECRET
        assert config.cluster.host == config.native.host == name  # what it advertises to its peers
        for mapping in service.get("ports", []):
            address, host, container = mapping.rsplit(":", 2)
            assert address == "127.0.0.1", "published on this host only unless PUBLISH_ADDRESS says otherwise"
            assert int(container) in dataclasses.asdict(STANDARD).values() and int(container) != STANDARD.replication
            published.append(int(host))
    assert all(settings == shared[0] for settings in shared), "the same cluster settings on every node"
    assert len({volume(service)[0] for service in nodes.values()}) == 3
    assert published and len(published) == len(set(published)), "each host port published once"
    opened = compose({"SLUICE_CLUSTER_SECRET": SECRET, "PUBLISH_ADDRESS": "0.0.0.0"})
    assert all(mapping.startswith("0.0.0.0:") for service in sluice_services(opened["services"]).values()
               for mapping in service["ports"])


# -- the compose file, run ----------------------------------------------------------------------

@dataclass
class Loopback:
    """Each service on a loopback address of its own, each container port on a free port."""

    address: dict[str, str]
    port: dict[int, int]
    paths: dict[str, Path]
    """Where each service's volume is, by the service."""

    def url_hosts(self, text: str, own: str | None = None) -> str:
        """``//service:port`` (and ``//0.0.0.0:port``, the ``own`` service's every address) moved."""
        def moved(match: re.Match) -> str:
            host, port = match.group(1), int(match.group(2))
            if host == "0.0.0.0":
                assert own is not None, f"0.0.0.0 in {text!r}"
                host = own
            assert host in self.address, f"{host!r} in {text!r} is no service of the compose file"
            assert port in self.port, f"port {port} in {text!r} is not one the test moves"
            return f"//{self.address[host]}:{self.port[port]}"
        return re.sub(r"//([A-Za-z0-9.-]+):(\d+)", moved, text)

    def volume_path(self, text: str, service: dict, name: str) -> str:
        _, target = volume(service)
        return str(self.paths[name]) + text[len(target):] if text.startswith(target) else text


def _etcd_command(name: str, service: dict, loop: Loopback) -> list[str]:
    binary = find_etcd()
    command = [binary]
    for word in service["command"][1:]:
        key, equals, value = word.partition("=")
        assert equals, f"{name}: write etcd flags as --flag=value"
        # 0.0.0.0 in a listen URL is every address of the container: here, the member's own
        value = loop.url_hosts(value, own=name if key.startswith("--listen-") else None)
        value = loop.volume_path(value, service, name)
        command.append(f"{key}={value}")
    return command


def _etcd_members(url: str) -> list[dict]:
    request = urllib.request.Request(url + "/v3/cluster/member/list", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=5) as reply:
        return json.load(reply)["members"]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as reply:
            return json.load(reply).get("health") == "true"
    except (OSError, ValueError):
        return False


def _node(name: str, service: dict, loop: Loopback, base_env: dict[str, str], ports: Ports) -> NodeProcess:
    """The container's process: the image's ENTRYPOINT and ENV with the service's command and
    environment, on the service's loopback address and the free ports."""
    env = {key: loop.volume_path(loop.url_hosts(value), service, name)
           for key, value in (image_env() | service["environment"]).items()}
    [entrypoint] = instruction("ENTRYPOINT")
    assert exec_form(entrypoint) == ["sluice"]
    arguments = list(service["command"])
    for index, word in enumerate(arguments[:-1]):
        if word == "--host":  # a service's name; anything else is left for the node to refuse
            arguments[index + 1] = loop.address.get(arguments[index + 1], arguments[index + 1])
    for field, flag in PORT_FLAGS.items():
        assert flag not in arguments, f"{name} sets {flag}: the test moves only the standard ports"
        arguments += [flag, str(getattr(ports, field))]
    data_dir = loop.paths[name]
    data_dir.mkdir(parents=True)  # the volume, there before the node starts
    return NodeProcess(name, loop.address[name], data_dir, [sys.executable, "-m", "sluice.cli", *arguments],
                       base_env | env)


def _wait_started(nodes: list[NodeProcess]) -> None:
    deadline = time.monotonic() + WAIT_S
    for node in nodes:
        while not node.ready.wait(0.2):
            if node.exited.is_set() or time.monotonic() > deadline:
                how = "exited" if node.exited.is_set() else "timed out"
                raise AssertionError(f"{node.name} did not start ({how}):\n"
                                     f"{node.log_path.read_text(errors='replace')[-3000:]}")


@dataclass
class Group:
    """What bench.cluster_load's cluster_view needs of a group."""

    nodes: list[NodeProcess]
    ports: Ports

    def node(self, name: str) -> NodeProcess:
        return next(node for node in self.nodes if node.name == name)


def _in_container(node: NodeProcess, *command: str) -> subprocess.CompletedProcess:
    """``docker compose exec <service> ...``: a command with the node's environment."""
    return subprocess.run(list(command), env=node.env, capture_output=True, text=True, timeout=60)


def _read_back(config: ClientConfig, topic: str, body: bytes) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            with SyncSimpleConsumer(config, "compose-readers", {topic: "*"}, await_duration=2) as consumer:
                while time.monotonic() < deadline:
                    for message in consumer.receive(max_messages=4):
                        consumer.ack(message)
                        if message.body == body:
                            return
        except SluiceClientError:
            continue
    raise AssertionError(f"{body!r} not read back from {topic} in time")


def test_the_compose_commands_form_etcd_and_a_replica_group_that_confirms_a_message(tmp_path, etcd_installed):
    services = compose()["services"]
    members, nodes = etcd_services(services), sluice_services(services)
    moved = free_ports(len(ETCD_PORTS) + len(PORT_FLAGS))
    ports = Ports(**dict(zip(PORT_FLAGS, moved[len(ETCD_PORTS):])))
    loop = Loopback(
        address={name: f"127.0.0.{FIRST_ETCD_ADDRESS + index}" for index, name in enumerate(sorted(members))}
        | {name: f"127.0.0.{FIRST_NODE_ADDRESS + index}" for index, name in enumerate(sorted(nodes))},
        port=dict(zip(ETCD_PORTS, moved)) | {getattr(STANDARD, field): getattr(ports, field) for field in PORT_FLAGS},
        paths={name: tmp_path / "volumes" / volume(service)[0] for name, service in services.items()})
    base_env = {key: value for key, value in os.environ.items() if not key.startswith("SLUICE_")}
    etcd: dict[str, subprocess.Popen] = {}
    group = Group([], ports)
    try:
        for name, service in sorted(members.items()):
            loop.paths[name].mkdir(parents=True)
            with open(tmp_path / f"{name}.log", "wb") as log:
                etcd[name] = subprocess.Popen(dying_with_parent(_etcd_command(name, service, loop)),
                                              stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        client_urls = {name: loop.url_hosts(flags(service["command"])["--advertise-client-urls"])
                       for name, service in members.items()}

        def etcd_up() -> bool:
            for name, process in etcd.items():
                assert process.poll() is None, \
                    f"{name} exited ({process.returncode}):\n{(tmp_path / f'{name}.log').read_text()[-3000:]}"
            return all(_healthy(url) for url in client_urls.values())
        wait_for("the three etcd members healthy (a leader elected among them)", etcd_up, WAIT_S)
        for name, url in client_urls.items():  # one cluster of three, as every member sees it
            seen = {member.get("name"): (member.get("peerURLs"), member.get("clientURLs"))
                    for member in _etcd_members(url)}
            assert seen == {member: ([loop.url_hosts(flags(service["command"])["--initial-advertise-peer-urls"])],
                                     [client_urls[member]]) for member, service in members.items()}, (name, seen)

        group.nodes = [_node(name, service, loop, base_env, ports) for name, service in sorted(nodes.items())]
        for node in group.nodes:
            node.start()
        _wait_started(group.nodes)
        last: list[dict | None] = [None]

        def formed() -> dict | None:
            last[0] = view = cluster_view(group)
            return view if view and view["leader"] and set(view["isr"]) == set(nodes) else None
        try:
            view = wait_for("a leader and all three nodes in sync", formed, WAIT_S)
        except AssertionError as error:
            raise AssertionError(f"{error}; the group's last view: {last[0]}") from None
        leader = group.node(view["leader"])
        wait_for(f"{leader.name} serving clients", leader.leading.is_set, WAIT_S)
        for node in group.nodes:  # `docker compose exec sluice-N sluice cluster status`, and the HEALTHCHECK
            done = _in_container(node, sys.executable, "-m", "sluice.cli", "cluster", "status", "--json")
            assert done.returncode == 0, done.stderr
            status = json.loads(done.stdout)
            assert status["leader"] == leader.name and sorted(status["isr"]) == sorted(nodes)
            names = {address: name for name, address in loop.address.items()}
            advertised = {n["id"]: names.get(n["address"], n["address"]) for n in status["nodes"]}
            assert advertised == {name: name for name in nodes}, status
            done = _in_container(node, *as_run_here(healthcheck()))
            assert done.returncode == 0, f"HEALTHCHECK of {node.name}: {done.stderr}"
        # docs/metrics.md's replica-group series, as the leader exports them (followers lack some)
        check_against_reference(scrape(f"{leader.host}:{ports.admin}"), section_only=CLUSTER_SECTION)

        first, second = [node for node in group.nodes if node is not leader]
        body = f"confirmed through {first.name}".encode()
        through_first = ClientConfig(f"{first.host}:{ports.native}", "sluice", "sluice", request_timeout=10)
        with SyncProducer(through_first) as producer:
            producer.send(Message("compose-check", body))
        _read_back(ClientConfig(f"{second.host}:{ports.native}", "sluice", "sluice", request_timeout=10),
                   "compose-check", body)

        grace = int(compose()["services"][leader.name]["stop_grace_period"].removesuffix("s"))
        for node in group.nodes:  # `docker compose down`: SIGTERM to every container
            node.signal(signal.SIGTERM)
        for node in group.nodes:
            try:
                code = node.process.wait(grace)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{node.name} did not stop within {grace} s of SIGTERM") from None
            assert code == 0, f"{node.name} stopped with status {code}:\n{node.log_path.read_text()[-3000:]}"
    finally:
        for node in group.nodes:
            node.kill()
        for process in etcd.values():
            if process.poll() is None:
                process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
