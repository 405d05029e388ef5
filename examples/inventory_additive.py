"""An inventory kept at three warehouses: stock movements at every site all count.

`qty` is additive: a site's update is replayed elsewhere as its delta (new - old), so concurrent
receipts and shipments of the same item at different sites add up instead of overwriting each
other. The script moves stock at random at all sites without refreshing, then replicates and
checks that every site holds the exact sum of all movements.

    python examples/inventory_additive.py [DIR]
"""

from __future__ import annotations

import random
import sqlite3
import sys
import tempfile
from pathlib import Path

from multimaster import api, load_topology

SITES = ("lyon", "hamburg", "milan")
TOPOLOGY = """\
sites:
  lyon:    {url: "sqlite:///lyon.db"}
  hamburg: {url: "sqlite:///hamburg.db"}
  milan:   {url: "sqlite:///milan.db"}
tables:
  stock:
    key: id
    columns:
      qty: additive
links: mesh
"""
ITEMS = {"bolts": 500, "nuts": 800, "washers": 300}


def main(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "topology.yaml").write_text(TOPOLOGY)
    for site in SITES:
        with sqlite3.connect(directory / f"{site}.db") as c:
            c.execute("DROP TABLE IF EXISTS stock")
            c.execute("CREATE TABLE stock (id INTEGER PRIMARY KEY AUTOINCREMENT, item TEXT NOT NULL, qty INTEGER NOT NULL)")
    with sqlite3.connect(directory / "lyon.db") as c:
        c.executemany("INSERT INTO stock (item, qty) VALUES (?, ?)", ITEMS.items())
    topo = load_topology(directory / "topology.yaml")
    api.init(topo)

    rnd = random.Random(42)
    expected = dict(ITEMS)
    for _ in range(300):  # receipts (+) and shipments (-) at every warehouse, nobody refreshing
        site, item, delta = rnd.choice(SITES), rnd.choice(list(ITEMS)), rnd.randint(-20, 30)
        with sqlite3.connect(directory / f"{site}.db") as c:
            c.execute("UPDATE stock SET qty = qty + ? WHERE item = ?", (delta, item))
        expected[item] += delta

    with api.Cluster(topo) as cl:
        rounds = 0
        while any(r.pulled for r in api.refresh(cl)):
            rounds += 1
        n_conflicts = len(api.conflicts(cl, limit=0))
    for site in SITES:
        with sqlite3.connect(directory / f"{site}.db") as c:
            got = dict(c.execute("SELECT item, qty FROM stock"))
        print(f"{site}: {got}")
        assert got == expected, f"{site} differs from the sum of all movements {expected}"
    print(
        f"every warehouse holds the sum of all 300 movements after {rounds} round(s); "
        f"{n_conflicts} concurrent movements were merged (additive conflicts)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mm-inventory-"))))
