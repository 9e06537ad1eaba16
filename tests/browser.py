"""Headless Chromium for the tests of the broker's web pages (the dashboard, the console):
Debian's chromium and chromedriver, a fresh profile, the browser log kept (CSP violations land
there). Skips, or fails under CI, when Chromium is missing."""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


def headless_chromium(profile: Path, window: str = "1280,1800") -> Iterator:
    """A Selenium driver of headless Chromium, quit when the generator is closed."""
    if not (os.path.exists(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing: apt-get install -y chromium chromium-driver")
        pytest.skip("Chromium is missing: apt-get install -y chromium chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--window-size={window}", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
