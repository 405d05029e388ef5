"""verify on a Spark standalone cluster (one master, one worker on 127.0.0.1) gives the same
answer as local mode, and `--record` stores it. Runs verify in a subprocess, as a user runs the
command: one SparkSession per process, started with the product's own settings."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mm_spark_helpers import make_every_kind

from multimaster.config.topology import load_topology
from multimaster.ops import verifications

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_standalone_cluster_same_result_as_local(spark, cluster, tmp_path):
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    spark_class = spark_home / "bin" / "spark-class"
    if not spark_class.exists():
        pytest.skip(f"{spark_class} not found in the installed PySpark")
    make_every_kind(cluster)
    from multimaster.spark import verify

    local = verify(cluster, spark=spark).to_dict()  # partitions 4: the answer does not depend on them

    env = dict(
        os.environ,
        SPARK_HOME=str(spark_home),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(tmp_path / "logs"),
        SPARK_WORKER_DIR=str(tmp_path / "work"),
        SPARK_NO_DAEMONIZE="1",
        PYSPARK_PYTHON=sys.executable,
    )
    mport, mweb, wweb = _free_port(), _free_port(), _free_port()
    master = worker = None
    try:
        master = subprocess.Popen(
            [
                str(spark_class),
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(mport),
                "--webui-port",
                str(mweb),
            ],
            env=env,
            stdout=open(tmp_path / "master.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait_port(mport, master)
        url = f"spark://127.0.0.1:{mport}"
        worker = subprocess.Popen(
            [
                str(spark_class),
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "1g",
                "--webui-port",
                str(wweb),
                url,
            ],
            env=env,
            stdout=open(tmp_path / "worker.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        r = subprocess.run(
            # --record: the command as a user runs it, in a process of its own, stores its result
            # (test_scheduled.py checks --record in this process); --partitions 2: the worker's cores
            [
                sys.executable,
                "-m",
                "multimaster.cli",
                "verify",
                "-t",
                str(cluster),
                "--master",
                url,
                "--partitions",
                "2",
                "--json",
                "--record",
            ],
            env=dict(env, PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")),
            capture_output=True,
            text=True,
            timeout=240,
            cwd=str(ROOT),
        )
        assert r.returncode == 1, r.stderr[-3000:]
        remote = json.loads(r.stdout)
    finally:
        _stop(worker)
        _stop(master)
    assert remote["master"] == url
    a, b = local["tables"]["items"], remote["tables"]["items"]
    for k in ("status", "rows", "fingerprints", "counts", "columns", "differing", "identities"):
        assert a[k] == b[k], k
    assert [s["rid"] for s in a["samples"]] == [s["rid"] for s in b["samples"]]
    v = verifications.last(load_topology(cluster))  # no verify section: recorded at the first site
    assert v is not None and (v["site"], v["source"], v["converged"], v["status"]) == ("s1", "manual", False, "diverged")
    assert v["summary"]["master"] == url and v["summary"]["sites"] == ["s1", "s2", "s3"]
    assert v["summary"]["tables"]["items"]["counts"] == a["counts"]
