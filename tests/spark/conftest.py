"""One quiet local SparkSession for the whole test run, and small SQLite clusters built by `multimaster init`."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

pytest.importorskip("pyspark", reason="PySpark is not installed (pip install 'pyspark>=4')")

from mm_spark_helpers import make_sqlite_cluster, require_server  # noqa: E402,F401 - require_server kept importable from here

from multimaster.spark.jdbc import MissingDependency, find_jars  # noqa: E402
from multimaster.spark.session import check_java, quiet_conf  # noqa: E402

#: Settings of the tests' session only. Adaptive execution submits every shuffle stage as a job of
#: its own and plans it again: a diverged verify of 3 x 200 rows ran 16 jobs (214 tasks) with it and
#: 6 jobs (110 tasks) without, about half the time, for the same answer. The product's settings
#: (adaptive on) still run in the tests that start their own Spark: test_standalone.py's CLI
#: subprocess.
TEST_CONF = {"spark.sql.adaptive.enabled": "false"}


@pytest.fixture(scope="session")
def spark():
    try:
        check_java()
        jars = find_jars({"sqlite", "postgresql", "mysql"})
    except MissingDependency as e:
        pytest.skip(str(e))
    from pyspark.sql import SparkSession

    wh = tempfile.mkdtemp(prefix="mm-spark-wh-")
    b = SparkSession.builder.master("local[2]").appName("multimaster-tests")
    for k, v in {**quiet_conf(jars, partitions=2, warehouse=wh), **TEST_CONF}.items():
        b = b.config(k, v)
    s = b.getOrCreate()
    s.sparkContext.setLogLevel("WARN")
    yield s
    s.stop()
    shutil.rmtree(wh, ignore_errors=True)


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """Three SQLite sites s1, s2, s3 (mesh) with the same 200 rows, then `multimaster init`;
    returns the topology path."""
    return make_sqlite_cluster(tmp_path / "sites", 3, 200)
