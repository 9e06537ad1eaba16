"""Build hooks of the documentation site (``hooks:`` in mkdocs.yml).

``docs/configuration.md`` holds the marker ``<!-- settings-reference -->``; at build time it is
replaced by the reference generated from the configuration dataclasses
(``sluice.server.config_reference``), so the page always lists the settings the code has.
"""

from __future__ import annotations

from mkdocs.exceptions import PluginError

from sluice.server.config_reference import render

MARKER = "<!-- settings-reference -->"
PAGE = "configuration.md"


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (MkDocs' signature)
    """The configuration page with the generated reference in place of its marker."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"docs/{PAGE} has lost its {MARKER} line: put it back where the "
                          "settings reference belongs")
    return markdown.replace(MARKER, render())
