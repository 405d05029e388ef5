"""The stamped capture of docs/design/mariadb-stamped-capture.md, prototyped, against plain and
multimaster as installed, side by side on MariaDB (issue #10's workloads).

    .venv/bin/python benchmarks/bench_mysql_stamped.py [--seconds 3] [--rounds 3] [--stamp-ms 20]

Three databases with the `items` table of benchmarks/bench_concurrency.py and its 1,000 base rows:

- ``plain``: no trigger;
- ``installed``: the first site of a 2-site cluster made by this tree's `init`;
- ``stamped``: the proposal's write path, built here by hand (not by `init`): a key trigger reading
  the table's gate row in SHARE MODE and drawing the key from a CYCLE SEQUENCE (`NEXTVAL`, as a
  renumbered table's does today), and capture
  triggers that append one row each to a pending log `_pend_items` (its own AUTO_INCREMENT, the wall
  clock, the connection; system-versioned, transaction-precise: ROW START names the transaction)
  and name no other table. A stamper thread (its own connection, every `--stamp-ms`) does what the
  proposal's stamper does, set-based, in one READ COMMITTED transaction: it locks the clock row,
  copies the pending entries its statement's snapshot shows into the change log `_log_items` with
  `seq = ver` given in pending order by a running maximum (`max(wall, previous + 1, clock)`, one
  `INSERT ... SELECT`; READ COMMITTED reads the source as a consistent read,
  without locks), brings the shadow up to date (an insert's rid is its version; an update takes
  its row's), deletes the pending rows it copied and moves the clock. Its history rows are dropped
  every 50 runs (`DELETE HISTORY`).

The stamper runs during every database's turn (it finds nothing to do during the others), so its
cost falls on the server in the stamped turns only, as it would. Each round runs every
configuration on every database, in a shuffled order; printed: tps per database, the paired ratios
to plain, and the entries the stamper left behind at the end (must be 0 once it caught up).

What the prototype leaves out, and the proposal has: deletes, natural-key incarnations, concurrent
heads, relays, key giving (the tail lock), a puller. It measures the write path and the stamper's
load on the server, which is what issue #10's floors are about.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pymysql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_concurrency import N_BASE, _threads, mm_cluster, plain_site  # noqa: E402
from clusters import MySQLBackend  # noqa: E402

#: the wall clock in clock units (ms * 65536), as the capture triggers read it (dialect.py WALL)
WALL = "CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) * 65536"

STAMPED_DDL = [
    f"CREATE SEQUENCE _keyseq_items START WITH {N_BASE + 1} CYCLE",
    "CREATE TABLE _pend_items (pid BIGINT AUTO_INCREMENT PRIMARY KEY, op CHAR(1) NOT NULL, k BIGINT NOT NULL, "
    "wall BIGINT NOT NULL, conn BIGINT NOT NULL, mask INT NOT NULL, n_name TEXT, n_qty INT, n_price DOUBLE, o_name TEXT, "
    "o_qty INT, o_price DOUBLE, rs BIGINT UNSIGNED GENERATED ALWAYS AS ROW START INVISIBLE, "
    "re BIGINT UNSIGNED GENERATED ALWAYS AS ROW END INVISIBLE, PERIOD FOR SYSTEM_TIME (rs, re)) "
    "ENGINE=InnoDB WITH SYSTEM VERSIONING",
    "CREATE TABLE _log_items (seq BIGINT PRIMARY KEY, ver VARCHAR(64) NOT NULL UNIQUE, op CHAR(1) NOT NULL, "
    "rid VARCHAR(64), `key` BIGINT NOT NULL, mask INT NOT NULL, txn VARCHAR(64) NOT NULL, pid BIGINT NOT NULL, run BIGINT NOT NULL, "
    "n_name TEXT, n_qty INT, n_price DOUBLE, o_name TEXT, o_qty INT, o_price DOUBLE, KEY (txn), KEY (pid)) ENGINE=InnoDB",
    "CREATE TABLE _shadow_items (`key` BIGINT PRIMARY KEY, rid VARCHAR(64) NOT NULL) ENGINE=InnoDB",
    "CREATE TABLE _clock (id INT PRIMARY KEY, clock BIGINT NOT NULL) ENGINE=InnoDB",
    "INSERT INTO _clock VALUES (1, 0)",
    "CREATE TABLE _gates (tbl VARCHAR(64) PRIMARY KEY) ENGINE=InnoDB",
    "INSERT INTO _gates VALUES ('items')",
    "INSERT INTO _shadow_items SELECT id, CONCAT('base:', id) FROM items",
    """CREATE TRIGGER _rank_items BEFORE INSERT ON items FOR EACH ROW BEGIN
  IF coalesce(@mm_applying, 0) = 0 THEN
    SELECT 1 INTO @mm_gate FROM _gates WHERE tbl = 'items' LOCK IN SHARE MODE;
    SET NEW.id = NEXTVAL(_keyseq_items);
  END IF;
END""",
    f"""CREATE TRIGGER _cap_i_items AFTER INSERT ON items FOR EACH ROW BEGIN
  IF coalesce(@mm_applying, 0) = 0 THEN
    INSERT INTO _pend_items (op, k, wall, conn, mask, n_name, n_qty, n_price)
      VALUES ('I', NEW.id, {WALL}, CONNECTION_ID(), 7, NEW.name, NEW.qty, NEW.price);
  END IF;
END""",
    f"""CREATE TRIGGER _cap_u_items AFTER UPDATE ON items FOR EACH ROW BEGIN
  IF coalesce(@mm_applying, 0) = 0 THEN
    IF NOT (OLD.id <=> NEW.id) THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'key change'; END IF;
    IF NOT (OLD.name <=> NEW.name AND OLD.qty <=> NEW.qty AND OLD.price <=> NEW.price) THEN
      INSERT INTO _pend_items (op, k, wall, conn, mask, n_name, n_qty, n_price, o_name, o_qty, o_price)
        VALUES ('U', NEW.id, {WALL}, CONNECTION_ID(),
                IF(OLD.name <=> NEW.name, 0, 1) | IF(OLD.qty <=> NEW.qty, 0, 2) | IF(OLD.price <=> NEW.price, 0, 4),
                NEW.name, NEW.qty, NEW.price, OLD.name, OLD.qty, OLD.price);
    END IF;
  END IF;
END""",
]

#: one stamper run after the clock row is locked (%(c)s: the clock): the pending entries this
#: statement's snapshot shows, positions by a running maximum in pending order, folded through a
#: user variable set to the clock first (STAMP_FIRST). Not a window function: MariaDB 10.11 computes
#: MAX(...) OVER (ORDER BY pid ROWS UNBOUNDED PRECEDING) in time quadratic in the rows (counted:
#: 866,000 instructions an entry in runs of 400, against 87,000 this way and 69,000 without any
#: running maximum); the order a user variable is evaluated in is not one MariaDB promises, so a
#: stamper to ship would fold in a procedure's cursor loop or in the client.
STAMP_FIRST = "SET @mm_m = %(c)s"
STAMP = """INSERT INTO _log_items (seq, ver, op, `key`, mask, txn, pid, run, n_name, n_qty, n_price, o_name, o_qty, o_price)
SELECT p, CONCAT(LPAD(p, 19, '0'), ':s'), op, k, mask, CONCAT(conn, ':', rs), pid, %(c)s, n_name, n_qty, n_price, o_name, o_qty, o_price
FROM (SELECT b.*, (@mm_m := GREATEST(@mm_m, wall - rn)) + rn AS p
      FROM (SELECT pid, op, k, wall, conn, mask, rs, n_name, n_qty, n_price, o_name, o_qty, o_price,
                   ROW_NUMBER() OVER (ORDER BY pid) AS rn FROM _pend_items) b ORDER BY pid) x"""
AFTER_STAMP = [
    "INSERT INTO _shadow_items (`key`, rid) SELECT `key`, ver FROM _log_items WHERE seq > %(c)s AND op = 'I' "
    "ON DUPLICATE KEY UPDATE rid = VALUES(rid)",
    "UPDATE _log_items l JOIN _shadow_items s ON s.`key` = l.`key` SET l.rid = s.rid WHERE l.seq > %(c)s AND l.op = 'U'",
    "DELETE p FROM _pend_items p JOIN _log_items l ON l.pid = p.pid WHERE l.seq > %(c)s",
    "UPDATE _clock SET clock = (SELECT coalesce(max(seq), %(c)s) FROM _log_items) WHERE id = 1",
]


def stamped_site(b: MySQLBackend, tmp: Path) -> str:
    url = plain_site(b, tmp, "stamped")
    c = b.connect(url)
    cur = c.cursor()
    for s in STAMPED_DDL:
        cur.execute(s)
    c.commit()
    c.close()
    return url


class Stamper(threading.Thread):
    """The proposal's stamper, every `every` seconds, on a connection of its own."""

    def __init__(self, b: MySQLBackend, url: str, every: float) -> None:
        super().__init__(daemon=True)
        self.conn = b.connect(url)
        self.every = every
        self.halt = threading.Event()
        self.runs = 0
        self.stamped = 0
        self.failed: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        cur = self.conn.cursor()
        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        try:
            while not self.halt.wait(self.every):
                try:
                    self.stamp(cur)
                except pymysql.MySQLError as e:  # a run that failed leaves its entries to the next
                    self.conn.rollback()
                    self.failed.append(str(e))
        except BaseException as e:  # noqa: BLE001 - reported by main()
            self.error = e

    def stamp(self, cur: Any) -> None:
        cur.execute("SELECT clock FROM _clock WHERE id = 1 FOR UPDATE")
        c = int(cur.fetchone()[0])
        cur.execute(STAMP_FIRST, {"c": c})
        n = cur.execute(STAMP, {"c": c})
        if n:
            for s in AFTER_STAMP:
                cur.execute(s, {"c": c})
        self.conn.commit()
        self.runs += 1
        self.stamped += n or 0
        if self.runs % 50 == 0:
            cur.execute("DELETE HISTORY FROM _pend_items")
            self.conn.commit()

    def left(self) -> int:
        cur = self.conn.cursor()
        self.conn.commit()
        cur.execute("SELECT count(*) FROM _pend_items")
        return int(cur.fetchone()[0])

    def out_of_order(self) -> int:
        """Entries whose position is not past the one before in pending order among those one run
        copied (must be 0: the user variable's fold is an order MariaDB does not promise; across runs
        a lower pid copied later, a transaction that committed later, has a higher position)."""
        cur = self.conn.cursor()
        cur.execute(
            "SELECT count(*) FROM (SELECT seq, LAG(seq) OVER (PARTITION BY run ORDER BY pid) AS prev FROM _log_items) x "
            "WHERE seq <= prev"
        )
        return int(cur.fetchone()[0])


CONFIGS = [("insert", 16, 2.0), ("update", 16, 2.0), ("insert", 1, 0.0)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stamp-ms", type=float, default=20.0, help="the stamper's period")
    args = ap.parse_args()
    b = MySQLBackend()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            urls = {"plain": plain_site(b, Path(tmp)), "stamped": stamped_site(b, Path(tmp))}
            urls["installed"] = mm_cluster(b, Path(tmp))[0]["c1"]
            stamper = Stamper(b, urls["stamped"], args.stamp_ms / 1000)
            stamper.start()
            res: dict[tuple[str, int, float], dict[str, list[float]]] = {k: {n: [] for n in urls} for k in CONFIGS}
            for r in range(args.rounds):
                for cfg in CONFIGS:
                    order = list(urls)
                    random.shuffle(order)
                    for name in order:
                        res[cfg][name].append(_threads(b, urls[name], cfg[0], cfg[1], args.seconds, cfg[2])["tps"])
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
            stamper.halt.set()
            stamper.join()
            if stamper.error is not None:
                raise stamper.error
            stamper.stamp(stamper.conn.cursor())
            left = stamper.left()
            print(f"MariaDB, {args.rounds} rounds of {args.seconds:g} s, stamper every {args.stamp_ms:g} ms")
            print(
                f"{'workload':24} {'plain tps':>10} {'installed':>10} {'stamped':>10} {'inst ÷ plain':>13} {'stamped ÷ plain':>16}"
            )
            for (wl, n, think), by in res.items():
                label = f"{wl} x{n}" + (f" ({think:g} ms think)" if think else ", no think")
                ri = statistics.median(i / p for i, p in zip(by["installed"], by["plain"]))
                rs = statistics.median(s / p for s, p in zip(by["stamped"], by["plain"]))
                med = {k: statistics.median(v) for k, v in by.items()}
                print(f"{label:24} {med['plain']:10.0f} {med['installed']:10.0f} {med['stamped']:10.0f} {ri:13.3f} {rs:16.3f}")
            print(
                f"stamper: {stamper.runs} runs, {stamper.stamped} entries stamped, {left} left pending at the end, "
                f"{stamper.out_of_order()} out of pending order within a run"
            )
            if stamper.failed:
                print(f"stamper: {len(stamper.failed)} runs failed and were retried, first: {stamper.failed[0]}")
            stamper.conn.close()
    finally:
        b.cleanup()


if __name__ == "__main__":
    main()
