"""The fault-injection suite, long mode (issue #13): round after round of the scenarios of
tests/faults.py on every database, for a fixed time, hundreds of SIGKILLs in all.

    .venv/bin/python benchmarks/faults.py --minutes 10                  # sqlite, postgresql, mysql
    .venv/bin/python benchmarks/faults.py --minutes 3 --databases sqlite --seed 42
    .venv/bin/python benchmarks/faults.py --minutes 30 --json > faults.json

Each database gets an equal share of --minutes. A round is one scenario on a fresh cluster of
three sites, with plain-client writers at every site all along:

- ``kills``: `multimaster run` daemons and `multimaster refresh --until-quiet` processes, one per
  site, SIGKILLed at random moments after their start-up (`--kills` per round); every third round
  also corrupts one change-log entry by hand, which every other site must hold in its error queue;
- ``down-and-back`` (SQLite: the site's files moved away; PostgreSQL: the database refuses
  connections and its sessions are terminated; MariaDB: the site's own login is locked and its
  sessions are killed): a site and its applications go down while the others write and their
  refreshers are killed, then come back;
- ``clock-ahead``: a site's clock set 8 s ahead, past refresh.max_clock_offset (2 s): its changes
  are held (status shows the link) until the wall clock is within the offset, then flow;
- ``remove-site``: a site dies for good with changes nobody pulled; `remove-site --force`
  retires it; exactly those changes are lost.

After each round the cluster is refreshed until quiet and every site is compared with the
reference model of the committed transactions (tests/faults.py). Printed per database: rounds,
kills (and how many landed after the process's start-up), transactions and changes written, lost
and duplicated (both must be 0), and the time to converge after the last kill (median and max).
A clock running ahead is simulated through the site's clock (the dialect's advance_clock), so no
libfaketime is needed. Exit 1 when any round lost or duplicated a change or found another problem;
each failing round prints its seed (``MM_FAULT_SEED=<n> pytest tests/test_faults.py`` replays a
short one; ``--seed`` replays this run's choices).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import faults  # noqa: E402
from clusters import BACKENDS  # noqa: E402

SCENARIOS = {
    "sqlite": ["kills", "down-and-back", "kills", "clock-ahead", "kills", "remove-site"],
    "postgresql": ["kills", "down-and-back", "kills", "clock-ahead", "kills", "remove-site"],
    "mysql": ["kills", "down-and-back", "kills", "clock-ahead", "kills", "remove-site"],
}


def one_round(db: str, scenario: str, seed: int, kills: int, corrupt: bool) -> faults.Result:
    backend = BACKENDS[db]()
    tmp = Path(tempfile.mkdtemp(prefix=f"mm-faults-{db}-"))
    try:
        if scenario == "kills":
            # one writer per site on a server: two outrun refreshers killed every few seconds, and the
            # backlog of interleaved inserts then costs minutes of key shifts (docs/performance.md)
            per_site = 2 if db == "sqlite" else 1
            return faults.kills(
                backend, tmp, seed, n_sites=3, n_kills=kills, corrupt=corrupt, per_site=per_site, life=(0.05, 3.0)
            )
        if scenario == "down-and-back":
            return faults.down_and_back(backend, tmp, seed, n_kills=max(6, kills // 2), down_s=5.0)
        if scenario == "clock-ahead":
            return faults.clock_ahead(backend, tmp, seed)
        if scenario == "remove-site":
            return faults.remove_dead_site(backend, tmp, seed, n_kills=max(6, kills // 2))
        raise ValueError(scenario)
    finally:
        backend.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


def run_database(db: str, seconds: float, seed: int, kills: int) -> dict[str, Any]:
    end = time.monotonic() + seconds
    out: dict[str, Any] = {
        "database": db,
        "rounds": 0,
        "kills": 0,
        "kills_in_work": 0,
        "txns": 0,
        "changes": 0,
        "lost": 0,
        "duplicated": 0,
        "converge_s": [],
        "failures": [],
        "scenarios": {},
    }
    i = 0
    while time.monotonic() < end or i == 0:
        scenario = SCENARIOS[db][i % len(SCENARIOS[db])]
        s = seed + i
        corrupt = scenario == "kills" and i % 3 == 0
        try:
            res = one_round(db, scenario, s, kills, corrupt)
        except Exception as e:  # noqa: BLE001 - a round that could not finish is a failure, reported
            res = faults.Result(db, scenario, s, problems=[f"{type(e).__name__}: {e}"])
        faults.say("  " + res.summary() + ("" if res.ok() else "\n  FAILED: " + res.failure().replace("\n", "\n    ")))
        out["rounds"] += 1
        out["scenarios"][res.scenario] = out["scenarios"].get(res.scenario, 0) + 1
        for k in ("kills", "txns", "changes", "lost", "duplicated"):
            out[k] += getattr(res, k)
        out["kills_in_work"] += res.notes.get("kills_in_work", 0)
        if res.converge_s:
            out["converge_s"].append(res.converge_s)
        if not res.ok():
            out["failures"].append({"scenario": res.scenario, "seed": s, "report": res.failure()})
        i += 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="total run time, shared equally by the databases")
    ap.add_argument("--seed", type=int, default=None, help="base seed (round i uses seed + i); default: random")
    ap.add_argument("--databases", default="sqlite,postgresql,mysql")
    ap.add_argument("--kills", type=int, default=30, help="kills per 'kills' round")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else faults.seed_from_env()
    dbs = [d.strip() for d in a.databases.split(",") if d.strip()]
    faults.say(f"fault injection, long mode: {a.minutes} min over {', '.join(dbs)}, --seed {seed}")
    results = []
    for n, db in enumerate(dbs):
        try:
            BACKENDS[db]().cleanup()
        except ConnectionError as e:
            faults.say(f"{db}: skipped ({e})")
            continue
        faults.say(f"{db}:")
        results.append(run_database(db, a.minutes * 60 / len(dbs), seed + 100_000 * n, a.kills))
    faults.say("")
    faults.say(
        "| database | rounds | kills (after start-up) | txns | changes written | lost | duplicated | converge after last kill, median / max |"
    )
    faults.say("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        cs = r["converge_s"] or [0.0]
        faults.say(
            f"| {r['database']} | {r['rounds']} | {r['kills']} ({r['kills_in_work']}) | {r['txns']} | {r['changes']} | "
            f"{r['lost']} | {r['duplicated']} | {statistics.median(cs):.2f} s / {max(cs):.2f} s |"
        )
    failed = [f for r in results for f in r["failures"]]
    for f in failed:
        faults.say(f"\nFAILED {f['scenario']} (seed {f['seed']}):\n{f['report']}")
    if a.json:
        print(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
