"""The client's layout: every source folder is a real package, so a normal install ships it."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("folder", ["sluice", "sluice/server", "sluice/cli", "sluice/client", "store", "core",
                                    "protocols", "protocols/mqtt", "protocols/amqp",
                                    "protocols/native", "analytics", "bench"])
def test_every_source_folder_is_a_package(folder):
    assert (ROOT / folder / "__init__.py").is_file(), f"{folder}/ has no __init__.py: installs would skip it"


@pytest.mark.parametrize("folder", ["tests", "docker"])
def test_the_other_folders_of_the_layout_exist(folder):
    assert (ROOT / folder).is_dir()
