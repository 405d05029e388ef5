"""A custom conflict resolver: `policy: {custom: "custom_resolver.prefer_higher_tier"}`.

When two sites change a customer's tier concurrently, the higher tier wins (gold > silver >
bronze), whichever site or timestamp; equal tiers fall back to the latest version. A resolver
receives a `multimaster.core.policies.Conflict` and returns `conflict.local` or `conflict.remote`; it
must not depend on which of the two arrived first, or sites would disagree.
`multimaster.core.policies.check_resolver` checks that on sample values — and catches the bad resolver
below, which prefers whatever this site holds.

    python examples/custom_resolver.py [DIR]

(The topology names the function by its import path: this file's directory is on sys.path when
it runs, as the directory of your own resolver module must be for `multimaster run`.)
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from multimaster.core.policies import Candidate, Conflict

RANK = {"bronze": 1, "silver": 2, "gold": 3}


def prefer_higher_tier(conflict: Conflict) -> Candidate:
    a, b = conflict.local, conflict.remote
    ra, rb = RANK.get(a.values.get("tier"), 0), RANK.get(b.values.get("tier"), 0)
    if ra != rb:
        return a if ra > rb else b
    return a if a.ver >= b.ver else b  # a tie: the latest version, like everywhere else


def prefer_local(conflict: Conflict) -> Candidate:
    """Wrong: the winner depends on which site resolves."""
    return conflict.local


TOPOLOGY = """\
sites:
  s1: {url: "sqlite:///s1.db"}
  s2: {url: "sqlite:///s2.db"}
tables:
  customers:
    key: id
    columns:
      tier: {custom: "custom_resolver.prefer_higher_tier"}
links: mesh
"""


def main(directory: Path) -> int:
    from multimaster import api, load_topology
    from multimaster.core.policies import check_resolver

    problems = check_resolver(
        prefer_higher_tier, samples=[("gold", "silver"), ("bronze", "gold"), ("silver", "silver"), (None, "gold")]
    )
    print("prefer_higher_tier:", "order independent" if not problems else problems)
    assert not problems
    bad = check_resolver(prefer_local)
    print(f"prefer_local: {len(bad)} problem(s), e.g. {bad[0]}")
    assert bad

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "topology.yaml").write_text(TOPOLOGY)
    for site in ("s1", "s2"):
        with sqlite3.connect(directory / f"{site}.db") as c:
            c.execute("DROP TABLE IF EXISTS customers")
            c.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, tier TEXT)")
    with sqlite3.connect(directory / "s1.db") as c:
        c.execute("INSERT INTO customers (name, tier) VALUES ('Ada', 'silver'), ('Grace', 'silver')")
    topo = load_topology(directory / "topology.yaml")
    api.init(topo)
    # concurrent edits: s1 upgrades Ada to gold, then s2 (later!) sets her to bronze; Grace both ways round
    edits = [("s1", "gold", 1), ("s2", "bronze", 1), ("s2", "gold", 2), ("s1", "bronze", 2)]
    for site, tier, key in edits:
        with sqlite3.connect(directory / f"{site}.db") as c:
            c.execute("UPDATE customers SET tier = ? WHERE id = ?", (tier, key))
        time.sleep(0.002)
    with api.Cluster(topo) as cl:
        while any(r.pulled for r in api.refresh(cl)):
            pass
    for site in ("s1", "s2"):
        with sqlite3.connect(directory / f"{site}.db") as c:
            rows = c.execute("SELECT id, name, tier FROM customers ORDER BY id").fetchall()
        print(site, rows)
        assert rows == [(1, "Ada", "gold"), (2, "Grace", "gold")], "the higher tier wins at every site"
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mm-resolver-"))))
