"""Instructions MariaDB runs per single-row transaction: plain, this tree, and the code of another
revision, counted (not timed) so two runs give the same figures on a noisy host.

    .venv/bin/python benchmarks/bench_mysql_instructions.py [--against d4c2b13] [--txns 400]

The MariaDB twin of benchmarks/bench_pg_instructions.py. Issue #10's single-connection floor asks
capture to cost no more than on the day the issue was filed (d4c2b13); on a 2-core shared host
timed ratios move by ±0.05 between runs, more than most changes to a trigger move them.
valgrind's callgrind counts the instructions a program executes, the same for the same binary,
input and data whatever else the machine does.

How: a throwaway MariaDB server (`mariadb-install-db` into a temporary directory, its own port and
socket, binary log off as on the test server) gets the `items` table of
benchmarks/bench_concurrency.py in a plain database, in the first site of a 2-site cluster made by
this tree's `init`, and in one made by `--against`'s (a worktree, as bench_concurrency.py does).
The server is stopped; then, per workload and database, on a fresh copy of its data directory,
`mariadbd --bootstrap` (the server reading statements from its standard input, without network)
runs under callgrind, counting only inside `mysql_parse` (each statement, its triggers and its
COMMIT; not start-up, not InnoDB's background threads), once with `--txns` / 5 transactions and
once with `--txns` more: the difference divided by `--txns` is the instructions per transaction.
Workloads, each transaction its own BEGIN / COMMIT as an application runs it:

- ``insert``: one INSERT of a row (the key from AUTO_INCREMENT, or multimaster's counter);
- ``update``: one UPDATE of a row by key;
- ``apply insert`` / ``apply update``: with `@mm_applying` set, as the reconciler writes, one
  statement of 1,000 rows (per row).

Printed: instructions per transaction (per row for the apply workloads), what multimaster adds to
plain, and plain ÷ multimaster (the ratio a CPU-bound run would approach). The client and the
protocol are not counted (the same for every database): what the capture itself costs.
`--stamped`: instead of `--against`, the prototype of docs/design/mariadb-stamped-capture.md
(benchmarks/bench_mysql_stamped.py), and what its stamper costs the server per entry.
`--parts`: instead of `--against`, one more site per variant of
benchmarks/bench_mysql_capture_parts.py (multimaster as installed with one part removed), counted
the same way: what each part of the capture costs, without the noise of timing. Under valgrind
every transaction takes milliseconds, so the clock is behind the wall clock at every draw and each
draw catches up (three rows in the clock); with one connection at ~2,000 transactions a second
nearly every draw does so too, with 16 clients about two in three (docs/performance.md).

Needs valgrind and the MariaDB server (`mariadbd`, `mariadb-install-db`). Figures:
docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_concurrency import against_site, mm_cluster, plain_site  # noqa: E402
from counted import APP_WORKLOADS, per_txn, print_table  # noqa: E402

WORKLOADS = {
    **APP_WORKLOADS,
    "apply insert": lambda i: (
        "BEGIN;\nSET @mm_applying = 1;\n"
        f"INSERT INTO items (id, name, qty, price) SELECT {10**7 + i * 1000} + seq, 'b', seq, 0.5 FROM seq_1_to_1000;"
        "\nCOMMIT;\nSET @mm_applying = NULL;"
    ),
    "apply update": lambda i: (
        "BEGIN;\nSET @mm_applying = 1;\nUPDATE items SET qty = qty + 1 WHERE id <= 1000;\nCOMMIT;\nSET @mm_applying = NULL;"
    ),
}
PER_ROW = {"apply insert": 1000, "apply update": 1000}

#: options of every start of the throwaway server: valgrind knows no io_uring, InnoDB's default
#: address reservation for a growing buffer pool is more than valgrind maps, and a buffer pool
#: loaded in the background at start-up would race the counted statements for the same pages
SERVER_OPTS = [
    "--no-defaults",
    "--innodb-buffer-pool-load-at-startup=0",
    "--innodb-buffer-pool-dump-at-shutdown=0",
    "--skip-log-bin",
    "--innodb-flush-log-at-trx-commit=1",
    "--innodb-use-native-aio=0",
    "--innodb-buffer-pool-size=32M",
    "--innodb-buffer-pool-size-max=64M",
    "--innodb-log-file-size=16M",
]


class Scratch:
    """A throwaway MariaDB server in a temporary directory (as the user mysql when run as root)."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "my"
        self.dir.mkdir()
        self.data = self.dir / "data"
        self.sock = self.dir / "sock"
        # a tmpdir of its own: a starting MariaDB deletes every '#sql*' file of its tmpdir
        # (mysql_rm_tmp_tables), so with the default /tmp each start of this server deleted the
        # temporary tables of every other MariaDB on the host in use (session 36: the shared test
        # server failed with "Error on delete of '/tmp/#sql-temptable-...MAI'" and crashed twice)
        self.tmp = self.dir / "tmp"
        self.tmp.mkdir()
        self.port = 3400 + os.getpid() % 500
        self.user = ["--user=mysql"] if os.geteuid() == 0 else []
        if self.user:
            os.chmod(base, 0o755)
            shutil.chown(self.dir, "mysql")
            shutil.chown(self.tmp, "mysql")
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={self.data}",
                f"--tmpdir={self.tmp}",
                *self.user,
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
            ],
            check=True,
            capture_output=True,
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start the server; returns its URL (root over TCP, as the test harness connects)."""
        self.proc = subprocess.Popen(
            [
                "mariadbd",
                *SERVER_OPTS,
                f"--datadir={self.data}",
                f"--tmpdir={self.tmp}",
                *self.user,
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.sock}",
                f"--pid-file={self.dir / 'pid'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(self.dir / "err.log", "wb"),  # noqa: SIM115 - the server's log, closed with the process
        )
        for _ in range(300):
            ok = subprocess.run(["mariadb", "-uroot", f"--socket={self.sock}", "-e", "SELECT 1"], capture_output=True)
            if ok.returncode == 0:
                break
            if self.proc.poll() is not None:
                raise SystemExit(f"the throwaway server did not start: {(self.dir / 'err.log').read_text()[-500:]}")
            time.sleep(0.1)
        subprocess.run(
            [
                "mariadb",
                "-uroot",
                f"--socket={self.sock}",
                "-e",
                "CREATE USER IF NOT EXISTS root@'%'; GRANT ALL ON *.* TO root@'%'",
            ],
            check=True,
            capture_output=True,
        )
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/"

    def stop(self) -> None:
        subprocess.run(["mariadb-admin", "-uroot", f"--socket={self.sock}", "shutdown"], capture_output=True)
        if self.proc is not None:
            self.proc.wait(timeout=120)

    def instructions(self, sql: str) -> int:
        """Instructions inside mysql_parse of a bootstrap server running `sql` on a fresh copy of
        the data directory."""
        run = self.dir / "run"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(self.data, run, symlinks=True)
        if self.user:
            subprocess.run(["chown", "-R", "mysql", str(run)], check=True)
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--vgdb=no",
                "--callgrind-out-file=/dev/null",
                "--toggle-collect=mysql_parse*",
                "mariadbd",
                *SERVER_OPTS,
                f"--datadir={run}",
                f"--tmpdir={self.tmp}",
                *self.user,
                "--bootstrap",
            ],
            input=sql.encode(),
            capture_output=True,
        )
        log = (out.stdout + out.stderr).decode(errors="replace")
        if out.returncode != 0 or re.search(r"\[ERROR\]", log):
            raise SystemExit(f"a statement failed in the bootstrap server: {log[-600:]}")
        got = re.search(r"Collected : (\d+)", log)
        if not got or int(got.group(1)) == 0:
            raise SystemExit(f"valgrind counted nothing: {log[-300:]}")
        return int(got.group(1))


def count_in(s: Scratch, db: str, workload: str, n: int) -> float:
    """Instructions per transaction (per row) of `workload` in database `db`."""
    return per_txn(lambda sql: s.instructions(f"USE `{db}`;\n" + sql), WORKLOADS[workload], n, PER_ROW.get(workload, 1))


def parts(s: Scratch, dbs: dict[str, str], workloads: list[str], txns: int) -> None:
    """Per workload, per variant: instructions per transaction and the difference to the site as
    installed (what the removed part costs)."""
    for w in workloads:
        n = txns if w not in PER_ROW else max(2, txns // 50)
        got = {name: count_in(s, db, w, n) for name, db in dbs.items()}
        print(f"\n{w}: {'variant':22} {'instructions':>13} {'÷ plain':>8} {'part costs':>11}")
        for name, g in got.items():
            part = "" if name in ("plain", "this tree") else f"{got['this tree'] - g:11,.0f}"
            print(f"{'':{len(w) + 2}}{name:22} {g:13,.0f} {got['plain'] / g:8.3f} {part}", flush=True)


def stamper_cost(s: Scratch, db: str, workloads: list[str], txns: int, every: int) -> None:
    """What the prototype's stamper (bench_mysql_stamped.py) costs the server per entry: each
    application workload again with a stamper run after every `every` transactions, less the
    workload alone (the stamper's work is off the writers' transactions, not off the server)."""
    from bench_mysql_stamped import AFTER_STAMP, STAMP, STAMP_FIRST

    run = "\n".join(
        [
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;",
            "BEGIN;",
            "SELECT clock INTO @c FROM _clock WHERE id = 1 FOR UPDATE;",
            *(q.replace("%(c)s", "@c") + ";" for q in [STAMP_FIRST, STAMP, *AFTER_STAMP]),
            "COMMIT;",
            "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ;",
        ]
    )
    for w in workloads:
        if w not in APP_WORKLOADS:
            continue
        alone = count_in(s, db, w, txns)
        with_stamper = per_txn(
            lambda sql: s.instructions(f"USE `{db}`;\n" + sql),
            lambda i, w=w: WORKLOADS[w](i) + ("\n" + run if i % every == every - 1 else ""),
            txns,
        )
        print(
            f"{w}: the stamper, every {every} transactions, costs {with_stamper - alone:,.0f} instructions per entry", flush=True
        )


def stamper_parts(s: Scratch, db: str, n: int) -> None:
    """The prototype's stamper taken apart: `n` inserts, then one stamper run of the statements
    up to each one (cumulative), less the inserts alone, per entry."""
    from bench_mysql_stamped import AFTER_STAMP, STAMP, STAMP_FIRST

    window = STAMP.replace(
        "(@mm_m := GREATEST(@mm_m, wall - rn)) + rn",
        "rn + GREATEST(%(c)s, MAX(wall - rn) OVER (ORDER BY pid ROWS UNBOUNDED PRECEDING))",
    )
    plain = STAMP.replace("(@mm_m := GREATEST(@mm_m, wall - rn)) + rn", "rn + %(c)s")
    names = ["the shadow", "the rids of updates", "the pending rows deleted", "the clock"]
    steps: dict[str, list[str]] = {
        "copy, no running maximum": [plain],
        "copy, window MAX": [window],
        "copy": [STAMP_FIRST, STAMP],
        **{f"+ {name}": [STAMP_FIRST, STAMP, *AFTER_STAMP[: i + 1]] for i, name in enumerate(names)},
    }
    ins = "\n".join(APP_WORKLOADS["insert"](i) for i in range(n))
    head = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;\nBEGIN;\nSELECT clock INTO @c FROM _clock WHERE id = 1 FOR UPDATE;"
    alone = s.instructions(f"USE `{db}`;\n{ins}\n")
    print(f"\nthe stamper taken apart, one run after {n} inserts (instructions per entry, cumulative):")
    for name, qs in steps.items():
        run = "\n".join(q.replace("%(c)s", "@c") + ";" for q in qs)
        got = s.instructions(f"USE `{db}`;\n{ins}\n{head}\n{run}\nCOMMIT;\n")
        print(f"  {name:28} {(got - alone) / n:>10,.0f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="d4c2b13", help="revision whose init makes the third database ('' for none)")
    ap.add_argument("--txns", type=int, default=400, help="transactions counted per workload (apply workloads: / 50)")
    ap.add_argument("--workloads", help="default: insert,update,apply insert,apply update (--parts: insert)")
    ap.add_argument("--parts", action="store_true", help="count bench_mysql_capture_parts.py's variants instead of --against")
    ap.add_argument(
        "--stamped", action="store_true", help="count bench_mysql_stamped.py's prototype instead of --against, and its stamper"
    )
    ap.add_argument("--stamper-parts", type=int, default=0, help="with --stamped: take one run of N entries apart")
    ap.add_argument("--stamp-every", type=lambda v: [int(x) for x in v.split(",")], default=[10, 100], help="with --stamped")
    args = ap.parse_args()
    for prog in ("valgrind", "mariadbd", "mariadb-install-db"):
        if shutil.which(prog) is None:
            raise SystemExit(f"{prog} is not installed (Debian: apt-get install valgrind mariadb-server)")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        s = Scratch(base)
        # the harness, this tree's init and --against's subprocess all talk to the throwaway server
        os.environ["MM_MYSQL_URL"] = s.start()
        from clusters import MySQLBackend

        try:
            b = MySQLBackend()
            (base / "plain").mkdir()
            (base / "mm").mkdir()
            urls = {"plain": plain_site(b, base / "plain"), "this tree": mm_cluster(b, base / "mm", ("i1", "i2"))[0]["i1"]}
            if args.parts:
                from bench_mysql_capture_parts import VARIANTS

                for i, (name, change) in enumerate(VARIANTS.items()):
                    if change is None:
                        continue
                    (base / f"v{i}").mkdir()
                    urls[name] = url = mm_cluster(b, base / f"v{i}", (f"v{i}", f"v{i}peer"))[0][f"v{i}"]
                    c = b.connect(url)
                    change(c.cursor(), False)
                    c.commit()
                    c.close()
            elif args.stamped:
                from bench_mysql_stamped import stamped_site

                (base / "st").mkdir()
                urls["stamped"] = stamped_site(b, base / "st")
            elif args.against:
                urls[args.against] = against_site(b, args.against, base)
        finally:
            s.stop()
        dbs = {name: url.rsplit("/", 1)[1].split("?")[0] for name, url in urls.items()}
        names = list(urls)
        print("MariaDB, instructions per transaction inside mysql_parse (apply workloads: per row), counted by callgrind")
        # the variants change the insert path (and two of them the draw of every change)
        default = "insert" if args.parts else "insert,update,apply insert,apply update"
        workloads = [x.strip() for x in (args.workloads or default).split(",") if x.strip()]
        if args.parts:
            return parts(s, dbs, workloads, args.txns)
        print_table(names, workloads, args.txns, PER_ROW, lambda i, w, n: count_in(s, dbs[names[i]], w, n))
        if args.stamped:
            for every in args.stamp_every:
                stamper_cost(s, dbs["stamped"], workloads, args.txns, every)
            if args.stamper_parts:
                stamper_parts(s, dbs["stamped"], args.stamper_parts)


if __name__ == "__main__":
    main()
