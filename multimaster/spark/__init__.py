"""Spark convergence checker (`multimaster verify`).

Importing this package does not import PySpark or start Java: the JVM starts on the first
`verify()` call. The rest of multimaster never imports this package unless verify is used.

    from multimaster.spark import verify
    result = verify("topology.yml")          # or a loaded Topology
    result.converged, result.to_dict()
"""

from __future__ import annotations

from multimaster.spark.api import DEFAULT_BUCKETS, DEFAULT_PARTITIONS, DEFAULT_SAMPLE, verify
from multimaster.spark.jdbc import MissingDependency
from multimaster.spark.result import KINDS, Sample, TableResult, VerifyResult, Waiting

__all__ = [
    "verify",
    "VerifyResult",
    "TableResult",
    "Sample",
    "Waiting",
    "KINDS",
    "MissingDependency",
    "DEFAULT_PARTITIONS",
    "DEFAULT_SAMPLE",
    "DEFAULT_BUCKETS",
]
