"""An offline site that reconnects after a day of edits.

A field office (`ship`) loses its link for a day. Both sides keep working: the office edits its
copy, headquarters and the branch edit theirs. While it is away, `status` shows the backlog and
how old the oldest change waiting for it is, and purge keeps every log entry the office has not
pulled (it is within the retention). When it is back, one refresh round per direction brings
everyone to the same rows: inserts made on both sides get their keys in global insertion order,
concurrent edits of the same row are resolved by policy and recorded as conflicts.

    python examples/offline_site.py [DIR]
"""

from __future__ import annotations

import random
import sqlite3
import sys
import tempfile
from pathlib import Path

from multimaster import api, load_topology
from multimaster.ops.purge import PurgePolicy, purge

SITES = ("hq", "branch", "ship")
TOPOLOGY = """\
sites:
  hq:     {url: "sqlite:///hq.db"}
  branch: {url: "sqlite:///branch.db"}
  ship:   {url: "sqlite:///ship.db"}     # the field office, offline for a day
tables:
  orders:
    key: id
    policy: latest
    columns:
      amount: additive
links:
  star: hq
"""


def write(directory: Path, site: str, sql: str, params: tuple = ()) -> None:  # type: ignore[type-arg]
    with sqlite3.connect(directory / f"{site}.db") as c:
        c.execute(sql, params)


def main(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "topology.yaml").write_text(TOPOLOGY)
    for site in SITES:
        with sqlite3.connect(directory / f"{site}.db") as c:
            c.execute("DROP TABLE IF EXISTS orders")
            c.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, customer TEXT, status TEXT, amount INTEGER)")
    with sqlite3.connect(directory / "hq.db") as c:
        c.executemany("INSERT INTO orders (customer, status, amount) VALUES (?, 'open', ?)", [(f"c{i}", 100) for i in range(20)])
    topo = load_topology(directory / "topology.yaml")
    api.init(topo)
    online = [ln for ln in topo.links if "ship" not in (ln.source, ln.target)]

    rnd = random.Random(1)
    with api.Cluster(topo) as cl:
        for hour in range(24):  # a day of edits; the ship's links are down
            for site in SITES:
                write(
                    directory,
                    site,
                    "INSERT INTO orders (customer, status, amount) VALUES (?, 'open', ?)",
                    (f"{site}-h{hour}", rnd.randint(1, 50)),
                )
                write(
                    directory,
                    site,
                    "UPDATE orders SET amount = amount + ? WHERE id = ?",
                    (rnd.randint(-5, 5), rnd.randint(1, 20)),
                )
                if rnd.random() < 0.3:
                    write(directory, site, "UPDATE orders SET status = ? WHERE id = ?", (f"{site}-checked", rnd.randint(1, 20)))
            for ln in online:
                api.refresh_link(cl, ln.target, ln.source)
        st = api.status(cl)
        for ln in st["links"]:
            if "ship" in (ln["from"], ln["to"]):
                print(f"while away: {ln['from']} -> {ln['to']}: {ln['waiting']} changes waiting")
        kept = purge(cl, policy=PurgePolicy(min_age=0))  # the ship is within the retention: nothing it needs goes
        hq = next(r for r in kept if r.site == "hq")
        print(f"purge at hq: {hq.purged} entries purged, held back by {hq.tables['orders'].held_by}")
        assert "ship" in hq.tables["orders"].held_by

        # the ship reconnects
        rounds = 0
        while any(r.pulled for r in api.refresh(cl)):
            rounds += 1
        conflicts = api.conflicts(cl, limit=0)
    rows = {}
    for site in SITES:
        with sqlite3.connect(directory / f"{site}.db") as c:
            rows[site] = c.execute("SELECT id, customer, status, amount FROM orders ORDER BY id").fetchall()
    assert rows["hq"] == rows["branch"] == rows["ship"], "all sites agree"
    assert len(rows["hq"]) == 20 + 24 * 3, "every insert made while apart is kept"
    print(
        f"back online: converged after {rounds} round(s): {len(rows['hq'])} orders everywhere, "
        f"{len(conflicts)} conflicts resolved (see multimaster conflicts)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mm-offline-"))))
