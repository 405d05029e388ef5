"""The airline last-seat case: two sites sell the last seat of a flight at the same time.

Asynchronous replication cannot prevent it (neither site sees the other's sale before it commits);
it can make every site agree on what happened and make it visible. `seats_left` is additive, so
both sales count and the flight ends at -1 everywhere: overbooked by one, a fact the airline
handles (rebook a passenger) instead of a sale that silently disappears. `last_passenger` is
latest-wins and the conflict is recorded at every site.

    python examples/airline_last_seat.py [DIR]
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from multimaster import api, load_topology

TOPOLOGY = """\
sites:
  paris:    {url: "sqlite:///paris.db"}
  new_york: {url: "sqlite:///new_york.db"}
tables:
  flights:
    key: id
    columns:
      seats_left: additive       # every sale counts, whichever site made it
      last_passenger: latest     # a single value: the latest sale wins, the other is a recorded conflict
links: mesh
"""


def main(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "topology.yaml").write_text(TOPOLOGY)
    for site in ("paris", "new_york"):
        with sqlite3.connect(directory / f"{site}.db") as c:
            c.execute("DROP TABLE IF EXISTS flights")
            c.execute(
                "CREATE TABLE flights (id INTEGER PRIMARY KEY AUTOINCREMENT, code TEXT, seats_left INTEGER, last_passenger TEXT)"
            )
    with sqlite3.connect(directory / "paris.db") as c:  # the common base: init copies it to new_york
        c.execute("INSERT INTO flights (code, seats_left) VALUES ('AF006', 1)")
    topo = load_topology(directory / "topology.yaml")
    api.init(topo)

    # both sites sell the last seat before hearing of each other
    for site, passenger in (("paris", "Mme Dupont"), ("new_york", "Mr Smith")):
        with sqlite3.connect(directory / f"{site}.db") as c:
            left = c.execute("SELECT seats_left FROM flights WHERE code = 'AF006'").fetchone()[0]
            assert left == 1, "each site sees one seat left"
            c.execute("UPDATE flights SET seats_left = seats_left - 1, last_passenger = ? WHERE code = 'AF006'", (passenger,))
        print(f"{site}: sold the last seat to {passenger}")
        time.sleep(0.002)

    with api.Cluster(topo) as cl:
        while any(r.pulled for r in api.refresh(cl)):
            pass
        states = {}
        for site in ("paris", "new_york"):
            with sqlite3.connect(directory / f"{site}.db") as c:
                states[site] = c.execute("SELECT code, seats_left, last_passenger FROM flights").fetchall()
        conflicts = api.conflicts(cl)
    print("after replication:", states)
    assert states["paris"] == states["new_york"], "both sites agree"
    code, seats, last = states["paris"][0]
    assert seats == -1 and last == "Mr Smith"
    print(f"{code} is overbooked by {-seats}: both sales are kept; rebook one passenger")
    for c in conflicts:
        print(f"  conflict at {c['site']}: {c['kind']} on {c['columns']} -> {c['decision']} ({c['policy']})")
    assert {c["site"] for c in conflicts} == {"paris", "new_york"}
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="mm-airline-"))))
