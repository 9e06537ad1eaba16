"""Metadata databases for the core tests: a SQLite file per test and a real PostgreSQL.

PostgreSQL comes from ``SLUICE_TEST_POSTGRES_URL`` if set (a ``postgresql+psycopg://`` URL the
tests may create schemas in); otherwise a throwaway cluster is started from the Debian binaries
for the test session. Each test gets its own schema, dropped afterwards.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from cryptography.fernet import Fernet
from sqlalchemy.engine import make_url

from core.metadata import MetadataRepository

INSTALL_HINT = ("PostgreSQL is not installed, so the metadata tests cannot run against it: "
                "install it with `apt-get install -y postgresql` (Debian/Ubuntu), or point "
                "SLUICE_TEST_POSTGRES_URL at a database (postgresql+psycopg://user:password@host/db)")


def _bin_dir() -> str | None:
    """The newest Debian PostgreSQL bin dir, or the one holding ``initdb`` on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    initdb = found[-1] if found else shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _as_postgres_user(command: list[str]) -> list[str]:
    """``command`` run as the ``postgres`` OS user when we are root (initdb refuses root)."""
    if os.geteuid() != 0:
        return command
    return ["runuser", "-u", "postgres", "--", *command]


def _local_cluster(bin_dir: str, root: str) -> int:
    """Start a cluster under ``root`` on a free loopback port; return the port."""
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.fail("tests run as root but there is no `postgres` OS user to run PostgreSQL "
                        "as; install the Debian package (`apt-get install -y postgresql`)")
        os.chown(root, owner.pw_uid, owner.pw_gid)
    data, port = os.path.join(root, "data"), _free_port()

    def run(*command: str) -> None:
        subprocess.run(_as_postgres_user(list(command)), check=True, capture_output=True, text=True)

    run(f"{bin_dir}/initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
        "--locale=C", "--no-sync")
    settings = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
    try:
        run(f"{bin_dir}/pg_ctl", "-D", data, "-o", settings, "-l", f"{root}/server.log", "-w", "start")
    except subprocess.CalledProcessError as error:
        log = open(f"{root}/server.log").read() if os.path.exists(f"{root}/server.log") else ""
        pytest.fail(f"PostgreSQL did not start: {error.stderr}\n{log}")
    return port


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A ``postgresql+psycopg://`` URL of a database the tests own for the session."""
    given = os.environ.get("SLUICE_TEST_POSTGRES_URL")
    if given:
        yield given.replace("postgresql://", "postgresql+psycopg://", 1)
        return
    bin_dir = _bin_dir()
    if bin_dir is None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(INSTALL_HINT)
    root = tempfile.mkdtemp(prefix="sluice-pg-")
    try:
        port = _local_cluster(bin_dir, root)
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:
            conn.execute("CREATE DATABASE sluice_test")
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/sluice_test"
    finally:
        if os.path.exists(f"{root}/data/postmaster.pid"):
            subprocess.run(_as_postgres_user([f"{bin_dir}/pg_ctl", "-D", f"{root}/data", "-m",
                                              "immediate", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _schema_url(postgres_url: str) -> Iterator[str]:
    """A URL whose connections see only a fresh schema, dropped when the generator finishes."""
    schema = f"t_{uuid.uuid4().hex[:16]}"
    admin = make_url(postgres_url).set(drivername="postgresql")
    conninfo = admin.render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield make_url(postgres_url).update_query_dict(
            {"options": f"-csearch_path={schema}"}).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(params=["sqlite", "postgres"])
def metadata_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """An empty metadata database of each backend, private to the test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/metadata.db"
    else:
        yield from _schema_url(request.getfixturevalue("postgres_url"))


@pytest.fixture
def master_key() -> bytes:
    return Fernet.generate_key()


@pytest.fixture
def repo(metadata_url: str, master_key: bytes) -> Iterator[MetadataRepository]:
    repository = MetadataRepository(metadata_url, master_key)
    yield repository
    repository.close()
