"""The configuration reference: every setting of the `Config` tree as Markdown tables.

One table per section (the top level, then ``[store]``, ``[core]``, ...), one row per leaf:
its TOML key, environment variable, type, default and description. Descriptions are the
string literals written after each field in the dataclasses (read from their source with
``ast``), so the reference is generated from the code and cannot drift from it. The docs
build (``mkdocs_hooks.py``) puts it into ``docs/configuration.md``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing
from typing import Any

from .config import Config, env_name


@dataclasses.dataclass(frozen=True)
class Setting:
    """One leaf of the configuration tree."""

    dotted: str
    hint: Any
    default: Any
    description: str


@dataclasses.dataclass(frozen=True)
class Section:
    """A TOML table (``""`` for the top level) with its description and its leaves."""

    name: str
    description: str
    settings: tuple[Setting, ...]


def field_docs(cls: type) -> dict[str, str]:
    """The docstring written after each field of dataclass ``cls``, by field name."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found: dict[str, str] = {}
    for statement, following in zip(body, body[1:]):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            found[statement.target.id] = inspect.cleandoc(following.value.value)
    return found


def sections(cls: type = Config, name: str = "") -> list[Section]:
    """``cls``'s own leaves as one section, then each nested section, in field order."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    defaults = cls()
    prefix = f"{name}." if name else ""
    leaves: list[Setting] = []
    nested: list[Section] = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            nested += sections(hint, prefix + field.name)
        else:
            leaves.append(Setting(prefix + field.name, hint, getattr(defaults, field.name),
                                  docs.get(field.name, "")))
    own = Section(name, inspect.cleandoc(cls.__doc__ or ""), tuple(leaves))
    return [own, *nested]


def type_name(hint: Any) -> str:
    """A hint as a reader names it: ``integer``, ``string or unset``, ``"sync" or "async"``."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return " or ".join(f'`"{value}"`' if isinstance(value, str) else f"`{value}`"
                           for value in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(arg) for arg in typing.get_args(hint))
    return {int: "integer", float: "number", bool: "boolean", str: "string",
            type(None): "unset"}.get(hint, str(hint))


def toml_value(value: Any) -> str:
    """A default as it would be written in the TOML file (None: left out, so unset)."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(config: type = Config) -> str:
    """The reference as Markdown: a heading and a table per section."""
    parts: list[str] = []
    for section in sections(config):
        if not section.settings:
            continue
        title = f"`[{section.name}]`" if section.name else "Top level"
        parts += [f"### {title}", "", _cell(section.description), "",
                  "| TOML key | environment variable | type | default | description |",
                  "|---|---|---|---|---|"]
        for setting in section.settings:
            key = setting.dotted.rsplit(".", 1)[-1]
            parts.append(f"| `{key}` | `{env_name(setting.dotted)}` | {type_name(setting.hint)} "
                         f"| {toml_value(setting.default)} | {_cell(setting.description)} |")
        parts.append("")
    return "\n".join(parts)
