"""The dashboard in headless Chromium: window aggregates published by the telemetry job's own
results sink show up as charts with data, and new ones appear without a reload."""
from __future__ import annotations

from datetime import datetime, timedelta
from io import BytesIO

import pytest

from analytics.telemetry_job import JobSettings, ResultsTopic, aggregate
from tests.analytics.test_remote import create_topic
from tests.browser import headless_chromium

LINE_COLOR, ANOMALY_COLOR = (0x1F, 0x6F, 0xD1), (0xD1, 0x49, 0x5B)  # dashboard.js COLOR
RESULTS = "telemetry.results"


@pytest.fixture
def browser(tmp_path):
    yield from headless_chromium(tmp_path / "chromium-profile")


BASE = datetime.now().replace(second=0, microsecond=0) - timedelta(minutes=6)


def readings(spark, minutes: range, devices: tuple[str, ...], spike: tuple[str, int] | None = None):
    """Readings every 10 s in the given minutes after ``BASE``; ``spike`` is (device, minute)
    of an anomaly."""
    start = BASE
    rows = []
    for minute in minutes:
        for second in range(0, 60, 10):
            at = start + timedelta(minutes=minute, seconds=second)
            for index, device in enumerate(devices):
                hot = 30.0 if (device, minute) == spike and second == 30 else 0.0
                rows.append((device, int(at.timestamp() * 1000), 20.0 + index + minute / 2 + hot,
                             45.0 + index, 90.0 - minute))
    frame = spark.createDataFrame(rows, "device STRING, ts BIGINT, temperature DOUBLE, "
                                        "humidity DOUBLE, battery DOUBLE")
    from pyspark.sql import functions as F
    return frame.withColumn("event_time", F.timestamp_millis("ts"))


def colored_pixels(png: bytes, color: tuple[int, int, int], tolerance: int = 12) -> int:
    from PIL import Image

    data = Image.open(BytesIO(png)).convert("RGB").tobytes()
    red, green, blue = color
    return sum(1 for i in range(0, len(data), 3)
               if abs(data[i] - red) <= tolerance and abs(data[i + 1] - green) <= tolerance
               and abs(data[i + 2] - blue) <= tolerance)


def test_the_dashboard_draws_published_windows_and_updates_live(spark, sluice_server, tmp_path, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    server = sluice_server(tmp_path / "broker")
    server.wait_ready()
    create_topic(server.admin, RESULTS, 2)
    sink = ResultsTopic(server.native, RESULTS)
    devices = ("d00001", "d00002", "d00003")
    sink.publish(aggregate(readings(spark, range(0, 4), devices, spike=("d00002", 2)), JobSettings()), 0)

    browser.get(f"{server.admin}/dashboard")
    wait = WebDriverWait(browser, 30)
    wait.until(lambda b: b.find_element(By.ID, "login").is_displayed())
    browser.find_element(By.ID, "password").send_keys("sluice")
    browser.find_element(By.ID, "sign-in").click()
    wait.until(lambda b: b.execute_script("return window.sluiceDashboard.received") >= 12)
    wait.until(lambda b: b.find_element(By.ID, "fleet-chart").get_attribute("data-points") == "4")
    browser.execute_script("window.loadedOnce = true")

    assert browser.find_element(By.ID, "devices").text == "3"
    assert browser.find_element(By.ID, "readings").text == "18"  # 3 devices x 6 readings
    assert browser.find_element(By.ID, "anomalies").text == "1"
    tiles = browser.find_elements(By.CSS_SELECTOR, "#device-grid .tile")
    assert [t.get_attribute("data-device") for t in tiles][0] == "d00002"  # anomalies first
    assert sorted(t.get_attribute("data-device") for t in tiles) == list(devices)
    assert "anomalous" in tiles[0].get_attribute("class")
    assert browser.find_element(By.ID, "device-chart").get_attribute("data-points") == "4"
    screenshot = browser.get_screenshot_as_png()
    (tmp_path / "dashboard.png").write_bytes(screenshot)
    assert colored_pixels(screenshot, LINE_COLOR) > 2000, "no temperature lines were drawn"
    assert colored_pixels(screenshot, ANOMALY_COLOR) > 50, "the anomaly is not marked"

    sink.publish(aggregate(readings(spark, range(4, 5), devices + ("d00004",)), JobSettings()), 1)
    wait.until(lambda b: b.find_element(By.ID, "fleet-chart").get_attribute("data-points") == "5")
    wait.until(lambda b: b.find_element(By.ID, "devices").text == "4")
    assert browser.execute_script("return window.loadedOnce") is True  # updated without reload
    assert len(browser.find_elements(By.CSS_SELECTOR, "#device-grid .tile")) == 4
    assert browser.find_element(By.ID, "latency").text != "–"

    # All of that worked under the page's Content-Security-Policy, which is in force: it
    # reported nothing, and it stops a script injected into the page.
    violations = [e["message"] for e in browser.get_log("browser") if "Content Security" in e["message"]]
    assert violations == []
    assert browser.execute_async_script(INJECT_INLINE_SCRIPT) == "blocked"


INJECT_INLINE_SCRIPT = """
const done = arguments[arguments.length - 1];
document.addEventListener("securitypolicyviolation", () => done(window.injected ? "ran" : "blocked"));
const script = document.createElement("script");
script.textContent = "window.injected = true";
document.body.appendChild(script);
setTimeout(() => done(window.injected ? "ran" : "no violation reported"), 5000);
"""
