"""The documentation site builds as `make docs` builds it: `mkdocs build --strict`, where any
warning (a broken link or anchor, a page missing from the navigation) fails; and the generated
configuration reference lists every setting the configuration has."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.server.config import Config, env_name, leaf_paths
from sluice.server.config_reference import render, sections
from tests.readme import ROOT


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    printed = done.stdout + done.stderr
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{printed}"
    warnings = [line for line in printed.splitlines() if "WARNING" in line or "Aborted" in line]
    assert not warnings, "\n".join(warnings)
    return out


def test_every_page_of_the_navigation_is_built(site):
    for page in ("index", "getting-started", "configuration", "native", "features", "mqtt", "amqp",
                 "spark", "clustering", "admin-api", "security", "operations", "architecture",
                 "performance"):
        built = site / "index.html" if page == "index" else site / page / "index.html"
        assert built.is_file(), f"{page} was not built"


def test_the_configuration_page_lists_every_setting(site):
    html = (site / "configuration" / "index.html").read_text()
    assert "settings-reference" not in html, "the marker was not replaced by the reference"
    missing = [dotted for dotted in leaf_paths() if env_name(dotted) not in html]
    assert not missing, f"settings missing from docs/configuration.md: {missing}"


def test_the_security_page_includes_the_threat_model(site):
    html = (site / "security" / "index.html").read_text()
    for heading in re.findall(r"^## (.+)$", (ROOT / "SECURITY.md").read_text(), re.M):
        assert heading in html, f"SECURITY.md's section {heading!r} is not on the security page"


def test_each_setting_row_shows_its_default_and_the_description_from_the_code():
    rows = {line.split("|")[2].strip(" `"): line for line in render().splitlines()
            if line.startswith("| `")}
    assert set(rows) == {env_name(dotted) for dotted in leaf_paths()}
    assert "| `8081` |" in rows["SLUICE_NATIVE_PORT"]
    assert '`"sync"` or `"async"`' in rows["SLUICE_STORE_FLUSH"]
    assert "| unset |" in rows["SLUICE_STORE_RETENTION_MAX_BYTES"]
    assert "captured request cannot be replayed" in rows["SLUICE_NATIVE_SIGNATURE_MAX_SKEW_S"]
    assert [section.name for section in sections(Config)][:2] == ["", "store"]
