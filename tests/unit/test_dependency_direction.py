"""Enforce the dependency direction of DESIGN.md: protocols -> core -> store <- analytics.

Imports are read with `ast` (nothing is imported). Relative imports are resolved to absolute
module names, so `from ..core import x` is caught like `from core import x`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Rule:
    """Modules under `package` may not import anything under `forbidden`, except under `allowed`."""

    package: str
    forbidden: tuple[str, ...]
    allowed: tuple[str, ...] = ()
    must_exist: bool = True

    def violates(self, module: str) -> bool:
        """Whether importing `module` breaks this rule."""
        return _under(module, self.forbidden) and not _under(module, self.allowed)


RULES = [
    Rule("store", ("core", "protocols", "analytics", "asyncio", "sqlalchemy", "grpc")),
    Rule("core", ("protocols", "analytics", "grpc", "pamqp", "amqtt", "paho")),
    Rule("analytics", ("core", "protocols"), allowed=("sluice.client",)),
    Rule("sluice.client", ("core",), must_exist=False),
    Rule("protocols.mqtt", ("protocols.amqp", "protocols.native")),
    Rule("protocols.amqp", ("protocols.mqtt", "protocols.native")),
    Rule("protocols.native", ("protocols.mqtt", "protocols.amqp")),
    Rule("protocols.admin", ("protocols.mqtt", "protocols.amqp", "protocols.native")),
]


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


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


def violations(rule: Rule) -> list[str]:
    """Return `file:line: import` for every import in the rule's package that breaks the rule."""
    root = REPO.joinpath(*rule.package.split("."))
    if rule.must_exist:
        assert root.is_dir(), f"package folder {root} is missing"
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(REPO)
        module = ".".join(rel.with_suffix("").parts)
        is_package = path.name == "__init__.py"
        if is_package:
            module = module.rpartition(".")[0]
        for line, imported in imports_in_source(path.read_text(), module, is_package):
            if rule.violates(imported):
                found.append(f"{rel}:{line}: {imported}")
    return found


@pytest.mark.parametrize("rule", RULES, ids=[r.package for r in RULES])
def test_dependency_direction(rule: Rule) -> None:
    """No module of the rule's package imports what the rule forbids."""
    bad = violations(rule)
    allowed = f" (except {', '.join(rule.allowed)})" if rule.allowed else ""
    assert not bad, f"{rule.package} must not import {', '.join(rule.forbidden)}{allowed}:\n" + "\n".join(bad)


def test_checker_flags_forbidden_import() -> None:
    """The checker flags forbidden imports, absolute and relative, and lets allowed ones pass."""
    store_rule, analytics_rule, mqtt_rule = RULES[0], RULES[2], RULES[4]
    source = "import os\nfrom core.x import y\nfrom .segment import Segment\n"
    found = imports_in_source(source, "store.log")
    assert found == [(1, "os"), (2, "core.x.y"), (3, "store.segment.Segment")]
    assert [(line, m) for line, m in found if store_rule.violates(m)] == [(2, "core.x.y")]
    relative = imports_in_source("from ..amqp import codec\n", "protocols.mqtt.session")
    assert [m for _, m in relative if mqtt_rule.violates(m)] == ["protocols.amqp.codec"]
    assert not analytics_rule.violates("sluice.client.client")
    assert analytics_rule.violates("protocols.native.server")
