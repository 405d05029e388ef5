"""The outcome of one verify run, as plain data (to_dict() is JSON-ready, no Spark objects)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["KINDS", "KIND_LABELS", "Waiting", "Sample", "TableResult", "VerifyResult", "table_status", "run_status"]

# Difference kinds, in report order.
KINDS = ("missing", "extra", "key", "values")
KIND_LABELS = {
    "missing": "missing at site",
    "extra": "extra at site (deleted elsewhere)",
    "key": "same row, different key",
    "values": "same row, different values",
}
# Table / run status
CONVERGED = "converged"
CONVERGING = "converging"  # differences, each on a row that a change still on its way touches
DIVERGED = "diverged"  # some differing row that no waiting change touches: nothing will fix it


def table_status(differing: int, unexplained: int) -> str:
    """A table's status from its differing identities and how many of them no waiting change
    touches: one such row is enough for diverged, whatever else is in flight."""
    if differing < 0 or not 0 <= unexplained <= differing:
        raise ValueError(f"differing={differing}, unexplained={unexplained}: need 0 <= unexplained <= differing")
    if differing == 0:
        return CONVERGED
    return DIVERGED if unexplained else CONVERGING


def run_status(statuses: list[str]) -> str:
    """A run's status from its tables': diverged if any is, converged if all are."""
    unknown = set(statuses) - {CONVERGED, CONVERGING, DIVERGED}
    if unknown:
        raise ValueError(f"unknown table status(es): {sorted(unknown)}")
    if DIVERGED in statuses:
        return DIVERGED
    return CONVERGING if CONVERGING in statuses else CONVERGED


@dataclass
class Waiting:
    """Changes not yet at `target` from `source` for one table."""

    source: str
    target: str
    unpulled: int  # in source's second-order log past target's watermark
    unapplied: int  # in target's snapshot of source with applied = 0 (or 2: waiting for its row)
    error: str | None = None

    @property
    def total(self) -> int:
        return self.unpulled + self.unapplied


@dataclass
class Sample:
    """One differing row. `sites` maps site -> {state, key, values} (values by column name)."""

    kind: str
    rid: str
    sites: dict[str, dict[str, Any]]
    odd_sites: list[str]  # the sites this difference is counted against
    columns: list[str] = field(default_factory=list)  # for kind 'values': the differing columns
    waiting: bool = False  # a waiting change touches this identity (else this difference is divergence)


@dataclass
class TableResult:
    table: str
    status: str
    rows: dict[str, int]  # rows in the table per site
    fingerprints: dict[str, str]  # bit_xor of per-row hashes (rid, key, values) per site
    identities: int  # distinct identities compared (rows + tombstones, all sites)
    differing: int  # identities with at least one difference
    counts: dict[str, dict[str, int]]  # kind -> site -> number of differing identities
    columns: dict[str, int]  # column -> identities whose value differs in it
    samples: list[Sample]
    waiting: list[Waiting]
    mode: str = "full"  # 'full' or 'checksum'
    buckets: int = 0  # checksum mode: key ranges hashed
    buckets_differing: int = 0  # checksum mode: key ranges drilled into
    seconds: float = 0.0
    unexplained: int = 0  # differing identities that no waiting change touches (diverged when > 0)

    @property
    def converged(self) -> bool:
        return self.status == CONVERGED

    @property
    def waiting_total(self) -> int:
        return sum(w.total for w in self.waiting)


@dataclass
class VerifyResult:
    sites: list[str]
    tables: dict[str, TableResult]
    master: str
    mode: str
    started_at: str
    seconds: float

    @property
    def status(self) -> str:
        return run_status([t.status for t in self.tables.values()])

    @property
    def converged(self) -> bool:
        return self.status == CONVERGED

    @property
    def exit_code(self) -> int:
        return 0 if self.converged else 1

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "status": self.status,
            "converged": self.converged,
            "sites": list(self.sites),
            "master": self.master,
            "mode": self.mode,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 3),
            "tables": {},
        }
        for name, t in self.tables.items():
            td = asdict(t)
            td["seconds"] = round(t.seconds, 3)
            td["waiting_total"] = t.waiting_total
            d["tables"][name] = td
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "VerifyResult":
        tables = {}
        for name, td in d["tables"].items():
            td = dict(td)
            td.pop("waiting_total", None)
            td["samples"] = [Sample(**s) for s in td["samples"]]
            td["waiting"] = [Waiting(**w) for w in td["waiting"]]
            tables[name] = TableResult(**td)
        return cls(d["sites"], tables, d["master"], d["mode"], d["started_at"], d["seconds"])
