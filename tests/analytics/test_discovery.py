"""`spark.read.format("sluice")` works from any directory, with no registration call: PySpark
finds the top-level ``pyspark_sluice`` module of the installed package (editable or not)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from store import FileStore, StoreConfig

ROOT = Path(__file__).resolve().parents[2]
READ = """
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").getOrCreate())
print("rows", spark.read.format("sluice").option("subscribe", "devices").load({path!r}).count())
spark.stop()
"""


def outside_env() -> dict[str, str]:
    """This environment without anything that would put the repository on a path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_DRIVER_PYTHON")}
    return {**env, "PYSPARK_PYTHON": sys.executable}


def test_a_script_outside_the_repository_reads_a_store_by_format_name(tmp_path):
    with FileStore(str(tmp_path / "data"), StoreConfig(segment_size=1 << 20)) as store:
        last = [store.append("devices", b"reading %d" % i, queue_id=0) for i in range(5)][-1]
        store.wait_durable(last.end_offset)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-c", READ.format(path=str(tmp_path / "data"))],
                          cwd=elsewhere, env=outside_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows 5" in done.stdout


def test_a_plain_install_puts_the_discovery_module_at_the_top_level(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(ROOT)], check=True, timeout=300,
                   cwd=tmp_path, capture_output=True)
    wheel, = tmp_path.glob("sluice-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "pyspark_sluice/__init__.py" in names and "analytics/source.py" in names
