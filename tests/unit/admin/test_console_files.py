"""The console's file server without sockets: only files in the console directory with a known
type, any requested name, never a file elsewhere on the disk."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.admin.console_files import CONSOLE_DIR, CONTENT_TYPES, console_file
from protocols.admin.errors import HttpProblem

VENDOR = CONSOLE_DIR / "vendor"


def test_the_page_its_modules_and_the_libraries_are_served_with_their_types():
    assert console_file(CONSOLE_DIR, "index.html").name == "index.html"
    assert console_file(CONSOLE_DIR, "app.js").suffix == ".js"
    assert console_file(VENDOR, "preact.mjs").suffix == ".mjs"
    assert CONTENT_TYPES[".js"] == CONTENT_TYPES[".mjs"] == "text/javascript"


@pytest.mark.parametrize("directory, name", [
    (CONSOLE_DIR, ".."), (CONSOLE_DIR, "../console_files.py"), (CONSOLE_DIR, "..%2Froutes.py"),
    (VENDOR, "../app.js"), (VENDOR, "package.json"), (VENDOR, "refresh.sh"),
    (VENDOR, "LICENSE-preact"),
    (CONSOLE_DIR, "vendor"), (CONSOLE_DIR, "missing.js"), (CONSOLE_DIR, ".hidden.js"),
    (CONSOLE_DIR, "/etc/passwd"), (CONSOLE_DIR, "..\\routes.py"),
])
def test_anything_else_is_not_found(directory, name):
    with pytest.raises(HttpProblem) as raised:
        console_file(directory, name)
    assert raised.value.status == 404 and "open /console" in str(raised.value)


@settings(max_examples=500, deadline=None)
@given(directory=st.sampled_from([CONSOLE_DIR, VENDOR]),
       name=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
       | st.lists(st.sampled_from(["..", ".", "vendor", "app.js", "", "index.html"]),
                  max_size=5).map("/".join))
def test_any_name_gives_a_served_file_in_its_directory_or_not_found(directory, name):
    try:
        path = console_file(directory, name)
    except HttpProblem as problem:
        assert problem.status == 404
        return
    assert path.parent == directory.resolve() and path.is_file()
    assert path.suffix in CONTENT_TYPES
