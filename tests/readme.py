"""The code blocks of README.md and of every page under docs/, as the tests that run them see them.

An HTML comment on the line before a fenced block says what a test does with it:

    <!-- test: run NAME -->     run it: a ``python`` block as a script, a ``sh``/``bash`` block
                                with ``bash -e`` (tests/integration/test_readme_examples.py)
    <!-- test: spark NAME -->   a PySpark block, run in the test session's Spark
                                (tests/analytics/test_readme_spark.py)
    <!-- test: file PATH -->    write it to PATH, for a later block to use (a Celery app module)
    <!-- test: cluster NAME --> run a ``python`` block against a three-node group while its
                                leader is killed (tests/cluster/test_readme_cluster.py)
    <!-- test: skip REASON -->  shown, not run (make targets, a second broker on the default
                                ports, commands that run until Ctrl+C)

Every ``python``, ``sh`` and ``bash`` block carries one of them, so a new example is run or
says why not. Names are unique across all pages. The pages name the default ports;
``on_ports`` rewrites them to a test broker's.

Pages come in reading order: README.md, then the pages of mkdocs.yml's navigation in order,
then any other page under docs/. A reader who follows them top to bottom against one broker
meets the topics and groups each page assumes (the quick start's ``orders`` and ``billing``).

Fences and markers are found by Sybil's Markdown lexers (fences in lists and block quotes,
``~~~`` fences, HTML comments); what runs a block stays with each test, since they need one
broker across pages, blocks chosen by name, or blocks run at the same time.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from sybil import Document
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, FencedCodeBlockLexer

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MKDOCS = ROOT / "mkdocs.yml"
RUNNABLE_LANGUAGES = ("python", "sh", "bash")
ACTIONS = ("run", "spark", "file", "cluster", "skip")
_FENCES = FencedCodeBlockLexer(language=r"[\w+-]*")
_MARKERS = DirectiveInHTMLCommentLexer(directive="test", arguments=r"(?:{})\s+.*?".format("|".join(ACTIONS)))


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, language, text, where it starts, and its marker."""

    page: str
    language: str
    code: str
    line: int
    action: str | None
    argument: str

    @property
    def where(self) -> str:
        """``docs/mqtt.md:42``, for messages."""
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md, the navigation's pages in order, then the other pages under docs/."""
    nav: list[str] = []

    def walk(entries: object) -> None:
        if isinstance(entries, str):
            nav.append(entries)
        elif isinstance(entries, list):
            for entry in entries:
                walk(entry)
        elif isinstance(entries, dict):
            for value in entries.values():
                walk(value)

    walk(yaml.safe_load(MKDOCS.read_text()).get("nav", []))
    ordered = [DOCS / name for name in nav if name.endswith(".md")]
    rest = sorted(set(DOCS.rglob("*.md")) - set(ordered))
    return [README, *ordered, *rest]


def blocks(page: Path = README) -> list[Block]:
    """Every fenced block of ``page``, in order, each with the marker right before it."""
    text = page.read_text()
    document = Document(text, str(page))
    # A marker's region ends before its closing ``-->``.
    markers = {text.index(">", region.end) + 1: region for region in _MARKERS(document)}
    name = str(page.relative_to(ROOT))
    found: list[Block] = []
    for region in sorted(_FENCES(document), key=lambda region: region.start):
        marker = markers.get(len(text[:region.start].rstrip()))  # only blank space between
        action, _, argument = (marker.lexemes["arguments"].partition(" ") if marker
                               else (None, "", ""))
        found.append(Block(name, region.lexemes["language"], str(region.lexemes["source"]),
                           text.count("\n", 0, region.start) + 1, action, argument.strip()))
    return found


def every_block() -> list[Block]:
    """The blocks of every page, in reading order (``pages``)."""
    return [block for page in pages() for block in blocks(page)]


DEFAULT_PORTS = ("1883", "5672", "8080", "8081", "8083")
"""The ports the examples name: MQTT, AMQP, admin API, native gRPC, MQTT WebSocket."""


def on_ports(code: str, ports: dict[str, int]) -> str:
    """``code`` with each default port (a whole number in the text) replaced by ``ports``'s."""
    return re.sub(r"(?<![\d.])(" + "|".join(DEFAULT_PORTS) + r")(?!\d)",
                  lambda m: str(ports[m.group(1)]), code)


MAKEFILE = ROOT / "Makefile"
_MAKE_RUN_SETTING = re.compile(r'(SLUICE_\w+)="\$\$\{\1-([^}]*)\}"')


def make_run_env(workdir: Path) -> dict[str, str]:
    """The settings ``make run`` gives the broker (``VAR="$${VAR-default}"`` in its recipe),
    with ``$(CURDIR)`` standing for ``workdir``: the README's broker in the tests is the one a
    reader starts."""
    recipe = MAKEFILE.read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    settings = dict(_MAKE_RUN_SETTING.findall(recipe))
    assert settings, "the Makefile's run recipe sets no SLUICE_* default"
    return {name: value.replace("$(CURDIR)", str(workdir)) for name, value in settings.items()}
