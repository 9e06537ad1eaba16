"""The MQTT adapter's asyncio side is rooms with one-way dependencies, and has no import cycle.

From the top: the edge (listeners and the front end that puts the rooms together), the
per-connection adapter, the session registry, persistence. A module may import its own room
and the rooms below it, never one above (the rooms above are reached through `typing.Protocol`s
they satisfy). Every other module (codec, sans-IO connection, mapping, topics, options) imports
none of the rooms. Imports are read with `ast`, ``TYPE_CHECKING`` ones included.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "protocols" / "mqtt"
ROOMS = [
    ("edge", {"frontend", "listeners", "websocket"}),
    ("adapter", {"adapter", "flow_control", "publish_intake"}),
    ("registry", {"registry", "login", "wills", "session", "shared", "retained"}),
    ("persistence", {"session_store"}),
]
"""Top first."""


def _imports() -> dict[str, set[str]]:
    """Module -> the modules of the package it imports."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names.add(node.module or "")
            elif isinstance(node, ast.ImportFrom) and node.module == "protocols.mqtt":
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("protocols.mqtt."):
                names.add(node.module.split(".")[2])
        found[path.stem] = {name.split(".")[0] for name in names} - {"", path.stem}
    return found


def _rank(module: str) -> int:
    """0 for the top room; len(ROOMS) for modules outside every room."""
    return next((i for i, (_, members) in enumerate(ROOMS) if module in members), len(ROOMS))


def test_every_room_module_exists():
    missing = {m for _, members in ROOMS for m in members} - set(_imports())
    assert not missing


def test_no_module_imports_a_room_above_its_own():
    wrong = [f"{module} ({ROOMS[_rank(module)][0] if _rank(module) < len(ROOMS) else 'base'}) "
             f"imports {imported} ({ROOMS[_rank(imported)][0]})"
             for module, imported_set in sorted(_imports().items())
             for imported in sorted(imported_set) if _rank(imported) < _rank(module)]
    assert not wrong, "\n".join(wrong)


def test_the_package_has_no_import_cycle():
    graph = _imports()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(module):], module]))
        if module in done:
            return
        for imported in sorted(graph.get(module, ())):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])

