"""What a SQLite capture design costs before any of multimaster's logic: bare insert triggers that
write only the rows a design needs, single-row transactions, WAL + synchronous=NORMAL, interleaved.

    .venv/bin/python benchmarks/bench_capture_floor.py

Prints, per design, inserts/s and the ratio to the same inserts without a trigger. It shows the
floor of a second-order log filled by a trigger on the change log (a third B-tree page per
single-row transaction) against the design multimaster uses on SQLite (the second-order log a view
over the change log: nothing written but the change); see docs/performance.md and docs/decisions.md.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

N = 15_000
ITEMS = "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, price REAL)"
STATE = ["CREATE TABLE st (id INTEGER PRIMARY KEY, site TEXT, applying INT, hlc INT)", "INSERT INTO st VALUES (1, 's1', 0, 0)"]
LOG = (
    "CREATE TABLE log (seq INTEGER PRIMARY KEY, ver TEXT NOT NULL, origin TEXT, op TEXT, rid TEXT, key INT, mask INT, "
    "n_name TEXT, o_name TEXT, n_price REAL, o_price REAL, n_qty INT, o_qty INT)"
)
LOG2 = [
    "CREATE TABLE log2 (seq2 INTEGER PRIMARY KEY, seq INT, op TEXT)",
    "CREATE TRIGGER l2a AFTER INSERT ON log BEGIN INSERT INTO log2 (seq, op) VALUES (NEW.seq, 'A'); END",
]
VERIDX = ["CREATE UNIQUE INDEX logv ON log (ver)"]
SHADOW = ["CREATE TABLE sh (key INTEGER PRIMARY KEY, rid TEXT NOT NULL UNIQUE, deleted TEXT)"]
HLC = (
    "max(st.hlc + 1, coalesce((SELECT CAST(substr(ver, 1, 19) AS INTEGER) FROM log ORDER BY seq DESC LIMIT 1), 0) + 1, "
    "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) * 65536)"
)


def capture(shadow: bool) -> str:
    # INSERT ... VALUES with scalar subqueries, as multimaster's triggers (an INSERT ... SELECT that
    # reads its own target goes through a temporary table)
    v = f"(SELECT printf('%019d:%s', {HLC}, site) FROM st)"
    body = [
        f"INSERT INTO log (ver, origin, op, rid, key, mask, n_name, n_price, n_qty) VALUES ({v}, (SELECT site FROM st), 'I', "
        f"'', NEW.id, 7, NEW.name, NEW.price, NEW.qty);"
    ]
    if shadow:
        body.append("INSERT INTO sh (rid, key) SELECT ver, key FROM log ORDER BY seq DESC LIMIT 1;")
    return "CREATE TRIGGER cap AFTER INSERT ON items WHEN (SELECT applying FROM st) = 0 BEGIN " + " ".join(body) + " END"


DESIGNS = {
    "no trigger": [],
    "change log, second-order log a view (multimaster, SQLite)": [
        LOG,
        "CREATE VIEW log2 AS SELECT seq AS seq2, seq, 'A' AS op FROM log",
        capture(False),
    ],
    "change log + trigger-filled second-order table": [LOG, *LOG2, capture(False)],
    "  + unique version index": [LOG, *LOG2, *VERIDX, capture(False)],
    "  + shadow row per insert": [LOG, *LOG2, *SHADOW, capture(True)],
    "  + both": [LOG, *LOG2, *VERIDX, *SHADOW, capture(True)],
}


# multimaster's own install (init of a two-site topology), as shipped and with the second-order log
# turned back into a table filled by a trigger on the change log: everything else equal
TRIGGER_FILLED = [
    "DROP VIEW _mm_log2_items",
    "CREATE TABLE _mm_log2_items (seq2 INTEGER PRIMARY KEY, seq INTEGER NOT NULL, op TEXT NOT NULL)",
    "CREATE TRIGGER _mm_l2a_items AFTER INSERT ON _mm_log_items WHEN (SELECT applying FROM _mm_state) = 0 "
    "BEGIN INSERT INTO _mm_log2_items (seq, op) VALUES (NEW.seq, 'A'); END",
]
INSTALLED = {
    "multimaster as installed (second-order log a view)": [],
    "multimaster with a trigger-filled second-order table": TRIGGER_FILLED,
}


def installed_template(d: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from multimaster import api
    from multimaster.config.topology import parse_topology

    for s in ("tpl", "peer"):
        sqlite3.connect(d / f"{s}.db").execute(ITEMS)
    api.init(
        parse_topology(
            {
                "sites": {s: {"url": f"sqlite:///{d / (s + '.db')}"} for s in ("tpl", "peer")},
                "tables": {"items": {"key": "id"}},
                "links": "mesh",
            }
        )
    )
    return d / "tpl.db"


def rate(d: Path, setup: list[str], template: Path | None = None) -> float:
    p = d / "x.db"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(str(p) + suffix):
            os.remove(str(p) + suffix)
    if template is not None:
        shutil.copy(template, p)
    c = sqlite3.connect(p, isolation_level=None)
    c.execute("PRAGMA journal_mode = WAL")
    c.execute("PRAGMA synchronous = NORMAL")
    for s in ([] if template is not None else [ITEMS, *STATE]) + setup:
        c.execute(s)
    t = time.perf_counter()
    for i in range(N):
        c.execute("BEGIN")
        c.execute("INSERT INTO items (name, qty, price) VALUES (?, ?, ?)", (f"n{i}", i, i * 0.5))
        c.execute("COMMIT")
    dt = time.perf_counter() - t
    c.close()
    return N / dt


def main() -> None:
    res: dict[str, list[float]] = {k: [] for k in [*DESIGNS, *INSTALLED]}
    with tempfile.TemporaryDirectory(prefix="mm-floor-") as tmp:
        (Path(tmp) / "tpl").mkdir()
        tpl = installed_template(Path(tmp) / "tpl")
        for _ in range(5):
            for k, setup in DESIGNS.items():
                res[k].append(rate(Path(tmp), setup))
            for k, setup in INSTALLED.items():
                res[k].append(rate(Path(tmp), setup, tpl))
    base = statistics.median(res["no trigger"])
    for k, v in res.items():
        m = statistics.median(v)
        print(f"{k:56s} {m:9.0f}/s  ratio {m / base:.2f}")


if __name__ == "__main__":
    main()
