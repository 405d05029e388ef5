"""Instructions a PostgreSQL backend runs per single-row transaction: plain, this tree, and the code
of another revision, counted (not timed) so two runs give the same figures on a noisy host.

    .venv/bin/python benchmarks/bench_pg_instructions.py [--against d4c2b13] [--txns 500]

Issue #10's single-connection floor asks capture to cost no more than on the day the issue was
filed (d4c2b13). On a 2-core shared host, tps ratios of one connection move by ±0.04 between
runs, more than a change of 20,000 instructions (3 % of a captured insert) moves them, so such
a change can be neither shown nor refuted by timing. valgrind's callgrind counts the instructions
a program executes: the same for the same binary, input and data, whatever else the machine does.

How: the `items` table of benchmarks/bench_concurrency.py in a plain database, in the first site
of a 2-site cluster made by this tree's `init`, and in one made by `--against`'s (a worktree, as
bench_concurrency.py does); each is copied with pg_dump into a throwaway PostgreSQL cluster
(initdb in a temporary directory, fsync and autovacuum off). Then, per workload and database, on a
fresh copy of it, one single-user backend (`postgres --single`) runs under callgrind, once with
`--txns` / 5 transactions and once with `--txns` more: the difference divided by `--txns` is the
backend's instructions per transaction (start-up and the copy cancel out). Workloads, each
transaction its own BEGIN / COMMIT as an application runs it:

- ``insert``: one INSERT of a row (the key from the table's default, or multimaster's counter);
- ``update``: one UPDATE of a row by key;
- ``apply insert`` / ``apply update``: with `mm.applying` on, as the reconciler writes, one
  statement of 1,000 rows (per row).

`--clock-ahead` sets each multimaster copy's clock an hour past the wall clock before counting:
under callgrind every draw jumps (AHEAD below says why), with it none does; a real site jumps at
most once every two milliseconds, so the two runs bound what a captured row costs (the clock is a
sequence from session 4 on: older revisions cannot be set ahead).

Printed: instructions per transaction (per row for the apply workloads), what multimaster adds to
plain, and plain ÷ multimaster (the ratio a CPU-bound run would approach). The server's
background processes and the client are not counted: what the capture itself costs.
Needs valgrind and PostgreSQL's server binaries (pg_config --bindir); as root, the throwaway
cluster runs as the user postgres. Figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_concurrency import against_site, mm_cluster, plain_site  # noqa: E402
from clusters import PostgresBackend  # noqa: E402
from counted import APP_WORKLOADS, per_txn, print_table  # noqa: E402

WORKLOADS = {
    **APP_WORKLOADS,
    "apply insert": lambda i: (
        "BEGIN;\nSELECT set_config('mm.applying', 'on', true);\n"
        f"INSERT INTO items (id, name, qty, price) SELECT {10**7 + i * 1000} + g, 'b', g, 0.5 FROM generate_series(1, 1000) g;"
        "\nCOMMIT;"
    ),
    "apply update": lambda i: (
        "BEGIN;\nSELECT set_config('mm.applying', 'on', true);\nUPDATE items SET qty = qty + 1 WHERE id <= 1000;\nCOMMIT;"
    ),
}
PER_ROW = {"apply insert": 1000, "apply update": 1000}
#: `--clock-ahead`: the clock an hour past the wall clock. Under callgrind a backend runs ~50 times
#: slower, so every draw finds the wall clock more than a millisecond ahead and jumps (site.sql
#: _mm_tick), which a site writing more often than every two milliseconds does at most once every
#: two; with the clock ahead no draw jumps: the counts of the common case
AHEAD = "SELECT setval('_mm._mm_clock', ((extract(epoch FROM clock_timestamp()) * 1000)::bigint + 3600000) << 16)"


class Scratch:
    """A throwaway PostgreSQL cluster in a temporary directory (as the user postgres when run as root)."""

    def __init__(self, base: Path) -> None:
        self.bindir = Path(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout.strip())
        self.dir = base / "pg"
        self.dir.mkdir()
        self.data = self.dir / "data"
        self.port = 5400 + os.getpid() % 500
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.dir, "postgres")
            os.chmod(base, 0o755)
        self.run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres")
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"fsync = off\nautovacuum = off\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n")
            f.write(f"unix_socket_directories = '{self.dir}'\n")

    def run(self, prog: str, *args: str, **kw: object) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
        return subprocess.run([*self.as_user, str(self.bindir / prog), *args], check=True, capture_output=True, **kw)  # type: ignore[call-overload, no-any-return]

    def start(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "start")

    def stop(self) -> None:
        self.run("pg_ctl", "-D", str(self.data), "-w", "stop")

    def psql(self) -> list[str]:
        """psql's command line for this cluster, stopping at the first error."""
        return [
            str(self.bindir / "psql"),
            "-q",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
        ]

    def copy_in(self, name: str, url: str) -> None:
        """Database `name` here, a pg_dump of the database of `url` on the test server."""
        db = url.rsplit("/", 1)[1].split("?")[0]
        psql = self.psql()
        subprocess.run([*psql, "-c", f'CREATE DATABASE "{name}"'], check=True, capture_output=True)
        dump = subprocess.run(
            [str(self.bindir / "pg_dump"), "-h", "127.0.0.1", "-p", "5432", "-U", "postgres", db], check=True, capture_output=True
        ).stdout
        subprocess.run([*psql, "-d", name], input=dump, check=True, capture_output=True)

    def sql(self, db: str, sql: str) -> None:
        """Run `sql` in database `db` here."""
        subprocess.run([*self.psql(), "-d", db, "-c", sql], check=True, capture_output=True)

    def instructions(self, template: str, sql: str) -> int:
        """Instructions of a single-user backend running `sql` in a fresh copy of `template`."""
        single = [str(self.bindir / "postgres"), "--single", "-D", str(self.data)]
        fresh = f'DROP DATABASE IF EXISTS "run"\nCREATE DATABASE "run" TEMPLATE "{template}"\n'
        subprocess.run([*self.as_user, *single, "postgres"], input=fresh.encode(), check=True, capture_output=True)
        out = subprocess.run(
            [*self.as_user, "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *single, "run"],
            input=sql.encode(),
            capture_output=True,
            check=True,
        )
        if b"ERROR:" in out.stdout or b"ERROR:" in out.stderr:
            err = (out.stdout + out.stderr).decode(errors="replace")
            raise SystemExit(f"{template}: a statement failed: {err[err.index('ERROR:') :][:300]}")
        got = re.search(rb"Collected : (\d+)", out.stderr)
        if not got:
            raise SystemExit(f"valgrind printed no count: {out.stderr.decode(errors='replace')[-300:]}")
        return int(got.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="d4c2b13", help="revision whose init makes the third database ('' for none)")
    ap.add_argument("--txns", type=int, default=500, help="transactions counted per workload (apply workloads: / 50)")
    ap.add_argument("--workloads", default="insert,update,apply insert,apply update")
    ap.add_argument(
        "--clock-ahead",
        action="store_true",
        help="set each site's clock an hour past the wall clock first, so no draw jumps (the common case)",
    )
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    b = PostgresBackend()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        try:
            (base / "plain").mkdir()
            (base / "mm").mkdir()
            urls = {"plain": plain_site(b, base / "plain"), "this tree": mm_cluster(b, base / "mm", ("i1", "i2"))[0]["i1"]}
            if args.against:
                urls[args.against] = against_site(b, args.against, base)
            s = Scratch(base)
            s.start()
            try:
                for i, url in enumerate(urls.values()):
                    s.copy_in(f"db{i}", url)
                    if args.clock_ahead and i > 0:
                        s.sql(f"db{i}", AHEAD)
            finally:
                s.stop()
        finally:
            b.cleanup()
        names = list(urls)
        print("PostgreSQL backend, instructions per transaction (apply workloads: per row), counted by callgrind")
        workloads = [x.strip() for x in args.workloads.split(",") if x.strip()]

        def measure(i: int, w: str, n: int) -> float:
            return per_txn(lambda sql: s.instructions(f"db{i}", sql), WORKLOADS[w], n, PER_ROW.get(w, 1))

        print_table(names, workloads, args.txns, PER_ROW, measure)


if __name__ == "__main__":
    main()
