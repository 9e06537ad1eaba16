"""Enforce the dependency direction of DESIGN.md ("Layout and dependency direction"):
sluice (server, cli) -> protocols -> core -> store <- analytics -> sluice.client.

Imports are read with `ast` (nothing is imported), including those inside functions and under
`if TYPE_CHECKING:`. Relative imports are resolved to absolute module names, so
`from ..core import x` is caught like `from core import x`; `from m import a` counts as
importing `m.a`, so a rule can allow a package's exported names without its other modules.
Every rule says why it exists; there are no per-file exceptions: a leak is fixed at its cause.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE_PACKAGES = ("store", "core", "protocols", "analytics", "sluice", "bench", "pyspark_sluice")
"""Every top-level package of the repository (tests/ is not checked)."""


def exported(package: str) -> tuple[str, ...]:
    """`package.<name>` for every name in the `__all__` of `package/__init__.py`."""
    tree = ast.parse(REPO.joinpath(*package.split("."), "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return tuple(f"{package}.{name}" for name in ast.literal_eval(node.value))
    raise AssertionError(f"{package}/__init__.py has no __all__")


STORE_PUBLIC = ("store.api", "store.errors", *exported("store"), "store.tier.body_schema",
                "store.tier.manifest", "store.tier.objects")
"""The store's public API: its contract (`store/api.py`), its errors, the names that
`store/__init__.py` exports, and the tier's documented contract (body schemas, the manifest,
object store errors). Everything else in `store/` is its own business."""
STORE_READER_API = ("store.StoreReader", "store.reader", "store.record_columns", "store.record_arrow",
                    "store.errors", "store.tier")
"""The read-only part of it, for code that reads a data directory (and its tier, in object
storage) with no broker running."""
STORE_BUILDERS = ("store.FileStore", "store.file_store", "store.MemoryStore", "store.memory_store")
"""What builds a store."""

SANS_IO = (
    "protocols.mqtt.codec",
    "protocols.mqtt.connection",
    "protocols.mqtt.events",
    "protocols.mqtt.packets",
    "protocols.mqtt.properties",
    "protocols.mqtt.reason_codes",
    "protocols.mqtt.state_table",
)
"""The sans-IO modules of MQTT (bytes in, events out), each listed: add a new one here."""
SANS_IO_NAMES = ("codec", "connection", "events", "frames", "methods", "packets", "properties",
                 "reason_codes", "state_table", "sansio")
"""A module of any protocol package with one of these names is sans-IO as well (AMQP's codec,
frames and methods when they come), and so is everything under a protocol's `sansio/`."""
SANS_IO_PATTERNS = tuple(f"protocols.*.{name}" for name in SANS_IO_NAMES)

PROTOCOLS = tuple(sorted(path.parent.name for path in REPO.glob("protocols/*/__init__.py")))
"""Every adapter package under protocols/."""

BENCH_ENTRY_POINTS = (
    "sluice.client",
    "sluice.cli.main",
    "sluice.cli.simulator",
    *STORE_PUBLIC,
    "store.tier.tierer",
    *SANS_IO,
    "analytics.register",
    "analytics.telemetry_job",
    "sluice.cli.dev_cluster",
)
"""What a benchmark may import: what users use. The SDK; the `sluice` command (`main`, or better
a `python -m sluice.cli` process), the simulator's fleet behind `sluice simulate` and the group
of `sluice serve` processes `sluice dev-cluster` starts; the
store's public API and its Tierer (a store benchmark builds its own stores, the analytics one
its own tier); the protocols' sans-IO codecs
(bytes in, bytes out); the Spark source's registration and the telemetry job that
`sluice analytics telemetry` runs. Never core, the server's insides or an adapter's asyncio
side: a benchmark measures the product as shipped."""

THIRD_PARTY_WIRE = ("grpc", "pamqp", "amqtt", "paho", "aiohttp", "rocketmq", "google.protobuf")
"""Wire libraries and generated wire types."""
IO = ("asyncio", "uvloop", "socket", "ssl", "selectors", "aiohttp", "grpc")


def _others(*kept: str) -> tuple[str, ...]:
    """Every top-level package but `kept`."""
    return tuple(p for p in SOURCE_PACKAGES if p not in kept)


@dataclass(frozen=True)
class Rule:
    """Modules matching `covers` (but not `exempt`) may not import anything under `forbidden`,
    except under `allowed`.

    Every entry is a dotted name that stands for itself and everything under it, and may use
    shell wildcards (`protocols.*.codec`). A `covers` entry without wildcards must match a
    module, so a rename cannot silently leave a module unchecked.
    """

    name: str
    reason: str
    covers: tuple[str, ...]
    forbidden: tuple[str, ...]
    allowed: tuple[str, ...] = ()
    exempt: tuple[str, ...] = ()

    def applies_to(self, module: str) -> bool:
        """Whether this rule checks the imports of `module`."""
        return _under(module, self.covers) and not _under(module, self.exempt)

    def violates(self, module: str) -> bool:
        """Whether importing `module` breaks this rule."""
        return _under(module, self.forbidden) and not _under(module, self.allowed)


RULES = [
    Rule("store", "Bytes on disk. Its reader runs in Spark executors with no broker: it needs "
         "nothing of Sluice above it, no event loop and no database.",
         covers=("store",), forbidden=(*_others("store"), "asyncio", "sqlalchemy", "grpc")),
    Rule("core", "The domain, under every adapter: it sees the store only through its public "
         "API, and no protocol, wire library or wire type.",
         covers=("core",), forbidden=("store", *_others("core", "store"), *THIRD_PARTY_WIRE),
         allowed=STORE_PUBLIC),
    Rule("protocols", "Adapters map their protocol onto core; they never reach the store, the "
         "server or analytics. The composition root builds all of them.",
         covers=("protocols",), forbidden=_others("protocols", "core")),
    *[Rule(f"protocols.{name}", "Adapters are independent of each other: one is added or "
           "removed without touching the others.",
           covers=(f"protocols.{name}",), forbidden=tuple(f"protocols.{other}" for other in PROTOCOLS
                                                          if other != name))
      for name in PROTOCOLS],
    Rule("sans-io", "Codecs and connection state machines turn bytes into events with no I/O: "
         "tested with plain bytes, reused over any transport, free of the domain.",
         covers=SANS_IO + SANS_IO_PATTERNS, forbidden=(*IO, "core", "store")),
    Rule("analytics", "Spark executors run it with no broker in the process: a data directory "
         "through the store's reader, a remote broker through the SDK.",
         covers=("analytics",), forbidden=_others("analytics"),
         allowed=(*STORE_READER_API, "sluice.client")),
    Rule("sluice.client", "The SDK users install: it speaks gRPC to a broker and carries none of it.",
         covers=("sluice.client",), forbidden=SOURCE_PACKAGES, allowed=("sluice.client",)),
    Rule("sluice.cli", "The `sluice` command is a client of the admin API and the SDK: it starts "
         "the server through sluice.server, reads data directories with the store's reader and "
         "speaks MQTT in the simulator with the sans-IO codec.",
         covers=("sluice.cli",), forbidden=("store", "core", "protocols", "bench"),
         allowed=(*STORE_READER_API, *SANS_IO)),
    Rule("bench", "Benchmarks measure the product as users get it.",
         covers=("bench",), forbidden=_others("bench"), allowed=BENCH_ENTRY_POINTS),
    Rule("store builders", "Only the composition root (sluice.server) builds a store; everything "
         "else is given one or reads a data directory with the store's reader.",
         covers=_others("store", "bench"), forbidden=STORE_BUILDERS, exempt=("sluice.server",)),
]


def _under(module: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(module, p) or fnmatchcase(module, p + ".*") for p in patterns)


def imports_in_source(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """Return (line, imported module) for every import in `source`, the code of module `module`.

    `from m import a` yields `m.a` (a may be a submodule); relative imports are made absolute.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: max(0, len(parts) - node.level + 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found += [(node.lineno, base if a.name == "*" else f"{base}.{a.name}") for a in node.names]
    return found


def modules() -> dict[str, Path]:
    """Every module of the source packages by its dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for top in SOURCE_PACKAGES:
        for path in sorted(REPO.joinpath(top).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if path.name == "__init__.py" else parts)] = path
    return found


def violations(rule: Rule, every: dict[str, Path] | None = None) -> list[str]:
    """Return `file:line: import` for every import of a covered module that breaks the rule."""
    every = modules() if every is None else every
    found: list[str] = []
    for module, path in every.items():
        if not rule.applies_to(module):
            continue
        for line, imported in imports_in_source(path.read_text(), module, path.name == "__init__.py"):
            if rule.violates(imported):
                found.append(f"{path.relative_to(REPO)}:{line}: {imported}")
    return found


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_dependency_direction(rule: Rule) -> None:
    """No module the rule covers imports what the rule forbids."""
    bad = violations(rule)
    allowed = f" (except {', '.join(rule.allowed)})" if rule.allowed else ""
    assert not bad, (f"{rule.name}: must not import {', '.join(rule.forbidden)}{allowed}. "
                     f"Why: {rule.reason}\n" + "\n".join(bad))


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_every_module_a_rule_names_exists(rule: Rule) -> None:
    """A renamed or moved module cannot drop out of a rule unnoticed."""
    every = modules()
    missing = [p for p in rule.covers if not any(c in p for c in "*?[")
               and not any(_under(m, (p,)) for m in every)]
    assert not missing, f"{rule.name} covers modules that do not exist: {missing}"


def test_checker_flags_forbidden_import() -> None:
    """The checker flags forbidden imports, absolute and relative, and lets allowed ones pass."""
    rule = {r.name: r for r in RULES}
    source = "import os\nfrom core.x import y\nfrom .segment import Segment\n"
    found = imports_in_source(source, "store.log")
    assert found == [(1, "os"), (2, "core.x.y"), (3, "store.segment.Segment")]
    assert [(line, m) for line, m in found if rule["store"].violates(m)] == [(2, "core.x.y")]
    relative = imports_in_source("from ..amqp import codec\n", "protocols.mqtt.session")
    assert [m for _, m in relative if rule["protocols.mqtt"].violates(m)] == ["protocols.amqp.codec"]

    core = rule["core"]
    assert not core.violates("store.replace_file") and not core.violates("store.api.Store")
    assert core.violates("store.durable_files.replace_file") and core.violates("store.view.StoreView")
    assert "store.replace_file" in STORE_PUBLIC and "store.durable_files" not in STORE_PUBLIC
    assert rule["store builders"].violates("store.FileStore") and not core.violates("store.FileStore")

    analytics = rule["analytics"]
    assert not analytics.violates("sluice.client.client") and not analytics.violates("store.StoreReader")
    assert analytics.violates("protocols.native.server") and analytics.violates("store.view.RecordRun")
    assert analytics.violates("sluice.cli.demo")

    sans_io = rule["sans-io"]
    assert sans_io.applies_to("protocols.mqtt.codec") and sans_io.applies_to("protocols.amqp.frames")
    assert sans_io.applies_to("protocols.amqp.sansio.methods") and not sans_io.applies_to("protocols.mqtt.listeners")
    assert sans_io.violates("asyncio") and sans_io.violates("core.errors.SluiceError")

    bench = rule["bench"]
    assert not bench.violates("sluice.client.Producer") and not bench.violates("store.FileStore")
    assert not bench.violates("protocols.mqtt.codec.Decoder")
    assert bench.violates("core.durable.BatchingAppender") and bench.violates("sluice.cli.demo.RESULTS_TOPIC")
    assert bench.violates("protocols.mqtt.listeners") and bench.violates("store.durable_files")

    builders = rule["store builders"]
    assert builders.applies_to("sluice.cli.main") and not builders.applies_to("sluice.server.app")
    assert set(PROTOCOLS) >= {"admin", "amqp", "mqtt", "native"}
