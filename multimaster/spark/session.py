"""Starting (or reusing) the SparkSession verify runs in, with a clear message when Java,
PySpark or a JDBC jar is missing."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from multimaster.spark.jdbc import MissingDependency

__all__ = ["check_java", "get_spark", "LOG4J2", "planning", "quiet_conf"]

JAVA_HINT = "Java 17 is needed to run Spark: apt-get install -y openjdk-17-jre-headless (or set JAVA_HOME)"
PYSPARK_HINT = "PySpark is needed for verify: pip install 'pyspark>=4'"

LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
logger.nativeload.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativeload.level = error
logger.snappy.name = org.apache.spark.util.Utils
logger.snappy.level = error
"""


def check_java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else shutil.which("java")
    if not java:
        raise MissingDependency(JAVA_HINT)
    try:
        subprocess.run([java, "-version"], capture_output=True, timeout=30, check=True)
    except Exception as e:  # pragma: no cover - broken java install
        raise MissingDependency(f"'{java} -version' failed ({e}). {JAVA_HINT}") from None
    return java


def _log4j_file() -> str:
    d = Path(tempfile.gettempdir()) / "multimaster-spark"
    d.mkdir(exist_ok=True)
    p = d / "log4j2.properties"
    if not p.exists() or p.read_text() != LOG4J2:
        p.write_text(LOG4J2)
    return str(p)


def quiet_conf(jars: list[str], partitions: int = 2, warehouse: str | None = None) -> dict[str, str]:
    """Spark settings for a quiet, small-footprint session (also used by the tests)."""
    log4j = _log4j_file()
    java_opt = f"-Dlog4j2.configurationFile=file:{log4j}"
    return {
        "spark.jars": ",".join(jars),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(max(2, partitions)),
        "spark.default.parallelism": str(max(2, partitions)),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.warehouse.dir": warehouse or str(Path(tempfile.gettempdir()) / "multimaster-spark" / "warehouse"),
        "spark.driver.extraJavaOptions": java_opt,
        "spark.executor.extraJavaOptions": java_opt,
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.debug.maxToStringFields": "1000",
        **PLANNING,
    }


# verify compares all sites in one plan of many aliased columns (spark/compare.py): Catalyst's
# constraint propagation grows with the product of aliases and predicates and took 10 s of a
# 17 s verify of a 3-site, 200-row table to plan one join; nothing here relies on inferred filters
PLANNING = {"spark.sql.constraintPropagation.enabled": "false"}


@contextlib.contextmanager
def planning(spark: Any) -> Iterator[None]:
    """Run verify's or repair's jobs on `spark` (perhaps the caller's own session) with PLANNING's
    settings, the session's own settings restored afterwards."""
    before = {k: spark.conf.get(k, None) for k in PLANNING}
    for k, v in PLANNING.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in before.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)


def get_spark(master: str, jars: list[str], partitions: int = 2, conf: dict[str, str] | None = None):
    """The process's SparkSession: the active one if there is one (its jars must already include
    the JDBC drivers), else a new one on `master`."""
    check_java()
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise MissingDependency(PYSPARK_HINT) from None
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    b = SparkSession.builder.master(master).appName("multimaster-verify")
    for k, v in {**quiet_conf(jars, partitions), **(conf or {})}.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
