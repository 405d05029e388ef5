"""What each part of a captured row costs on MariaDB, one connection, no think time.

    .venv/bin/python benchmarks/bench_mysql_capture_parts.py [--rounds 25] [--rows 400] [--natural]
    .venv/bin/python benchmarks/bench_mysql_capture_parts.py --clients 16 --think-ms 2 --rows 8000 --rounds 6
    .venv/bin/python benchmarks/bench_mysql_capture_parts.py --rows-per-txn 10 [--one-statement] --rows 2000

Issue #10's single-connection floor for MariaDB (0.75 of plain) is not met; this script says where
the time goes. One plain database and one multimaster site per variant (each the first site of a
2-site cluster nobody pulls from); every variant takes multimaster as installed and removes one
part, by replacing the site's own objects after `init`:

- ``installed``: multimaster as `init` leaves it;
- ``no transaction id``: the clock `_mm_tick` not system-versioned (no `mysql.transaction_registry`
  row at COMMIT; readers could no longer stamp the entries' transaction ids, site.sql `_mm_stamp`);
- ``clock lagging 4 ms``: the draw moves the clock to the wall clock only once it is 4 ms behind
  (fewer catch-up rows; versions up to 4 ms behind the wall clock in every latest-timestamp
  decision, docs/decisions.md);
- ``no clock catch-up``: the draw never moves the clock to the wall clock (one row in the clock per
  draw instead of three whenever the clock is behind; versions would fall behind the wall clock);
- ``no gate table``: the key trigger's branch that creates a connection's slot (once per
  connection) without reading the gate `_mm_gates` (MariaDB opens and locks every table a trigger
  names in every statement that fires it, whichever branch runs);
- ``no shadow row``: the insert trigger without the shadow row (the reconciler would lack it);
- ``no clock draw``: the slot's UPDATE takes a `UUID_SHORT()` instead of calling `_mm_draw` (no
  row in the clock, no transaction id);
- ``no slot``: the key trigger calls `_mm_draw` without locking its connection's slot;
- ``log row only``: one AFTER INSERT trigger writing the change-log row with a `UUID_SHORT()`
  position, nothing else (the floor of any trigger that logs a row);
- ``log row + txn id``: ``log row only`` with the change log system-versioned, transaction-precise
  (each entry's ROW START is its transaction's id; one registry row at COMMIT);
- ``slot read-locked``: the key trigger locks its slot with a locking read (`SELECT ... FOR
  UPDATE`) instead of the UPDATE that writes the position into it (the slot's committed `cur`
  would no longer move: a horizon could not pass a connection that keeps writing);
- ``draw inline``: the draw's statements in the key trigger instead of a call of `_mm_draw`, the
  slot's UPDATE writing a session variable (not a design: the slot's `cur` then lags a draw);
- ``read-locked + inline``: both;
- ``ver not unique`` / ``no ver index`` / ``no txn index``: the change log's UNIQUE (ver) as a
  plain index, dropped; its index of transactions dropped (what one more index costs a row);
- ``no triggers``: the site with multimaster's triggers on the table dropped (should read ~1.0).

Each round runs every variant once, in a shuffled order: `--rows` rows inserted by `--clients`
connections, in transactions of `--rows-per-txn` INSERTs (or one multi-row INSERT,
`--one-statement`), each with `--think-ms` of application work before its COMMIT (autocommit off,
as applications run). The default is one row per transaction, one connection, no think time.
Printed per variant: the median rate, the median of the paired ratios to plain in the same round,
and the median extra time per row against plain (µs). The variants are measurements, not designs:
each one drops a guarantee (docs/performance.md, "On another host: MariaDB below the floors").
Databases are created with unique names and dropped at the end.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from clusters import ITEMS, MySQLBackend, make_cluster  # noqa: E402


def _retrigger(cur: Any, name: str, edit: Callable[[str], str]) -> None:
    """Create trigger `name` again with its body passed through `edit`."""
    cur.execute(
        "SELECT ACTION_TIMING, EVENT_MANIPULATION, EVENT_OBJECT_TABLE, ACTION_STATEMENT FROM information_schema.TRIGGERS "
        "WHERE TRIGGER_SCHEMA = DATABASE() AND TRIGGER_NAME = %s",
        (name,),
    )
    timing, event, table, body = cur.fetchone()
    new = edit(body)
    if new == body:
        raise SystemExit(f"variant did not change trigger {name}: multimaster's trigger text moved on; update this script")
    cur.execute(f"DROP TRIGGER {name}")
    cur.execute(f"CREATE TRIGGER {name} {timing} {event} ON `{table}` FOR EACH ROW {new}")


def _redraw(cur: Any, edit: Callable[[str], str]) -> None:
    """Create the site's `_mm_draw` (site.sql) again with its body passed through `edit`."""
    cur.execute(
        "SELECT ROUTINE_DEFINITION FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = '_mm_draw'"
    )
    body = cur.fetchone()[0]
    new = edit(body)
    if new == body:
        raise SystemExit("variant did not change _mm_draw: multimaster's function text moved on; update this script")
    cur.execute(
        f"CREATE OR REPLACE FUNCTION _mm_draw() RETURNS BIGINT NOT DETERMINISTIC MODIFIES SQL DATA SQL SECURITY DEFINER {new}"
    )


def _no_txn_id(cur: Any, natural: bool) -> None:
    cur.execute("SELECT coalesce(max(t), 0) + 1 FROM _mm_tick")
    top = int(cur.fetchone()[0])
    cur.execute("DROP TABLE _mm_tick")
    cur.execute(f"CREATE TABLE _mm_tick (t BIGINT AUTO_INCREMENT PRIMARY KEY) ENGINE=InnoDB AUTO_INCREMENT={top}")


#: the draw's test for a clock behind the wall clock, with its slack (site.sql `_mm_draw`)
_BEHIND = re.compile(r"IF p(?: \+ \d+)? < w THEN")


def _lagging(cur: Any, natural: bool) -> None:
    _redraw(cur, lambda b: _BEHIND.sub(f"IF p + {4 * 65536} < w THEN", b, count=1))


def _no_catch_up(cur: Any, natural: bool) -> None:
    _redraw(cur, lambda b: _BEHIND.sub("IF FALSE THEN", b, count=1))


def _no_gate(cur: Any, natural: bool) -> None:
    """The key trigger's slot-creation branch (taken once per connection) without the gate
    `_mm_gates`: every table a trigger names is opened and locked by every statement that fires
    it. A natural-key table has no key trigger, and no gate: nothing to take out."""
    if not natural:
        _retrigger(cur, "_mm_rank_items", lambda b: re.sub(r"SELECT 1 INTO @mm_gate FROM _mm_gates [^;]*;", "", b))


def _no_shadow(cur: Any, natural: bool) -> None:
    _retrigger(cur, "_mm_cap_i_items", lambda b: re.sub(r"INSERT INTO `_mm_shadow_items` [^;]*;", "", b))


def _no_draw(cur: Any, natural: bool) -> None:
    name = "_mm_cap_i_items" if natural else "_mm_rank_items"
    _retrigger(cur, name, lambda b: b.replace("_mm_draw()", "UUID_SHORT()"))


def _no_slot(cur: Any, natural: bool) -> None:
    name = "_mm_cap_i_items" if natural else "_mm_rank_items"
    pattern = r"SET @mm_p = NULL;\s*IF @mm_s_\w+ .*?SET @mm_s_\w+ = \d;\s*END IF;"
    _retrigger(cur, name, lambda b: re.sub(pattern, "SET @mm_p = _mm_draw();", b, count=1, flags=re.S))


def _log_only(cur: Any, natural: bool) -> None:
    cur.execute("DROP TRIGGER IF EXISTS _mm_rank_items")
    cur.execute("DROP TRIGGER _mm_cap_i_items")
    cur.execute(
        """CREATE TRIGGER _mm_cap_i_items AFTER INSERT ON items FOR EACH ROW BEGIN
  DECLARE mm_v VARCHAR(255);
  IF coalesce(@mm_applying, 0) = 0 THEN
    SET @mm_p = UUID_SHORT();
    SET mm_v = CONCAT(LPAD(@mm_p, 19, '0'), ':', 'v');
    INSERT INTO _mm_log_items (seq, ver, origin, op, rid, `key`, mask, txn, sv, n_name, n_price, n_qty)
      VALUES (@mm_p, mm_v, 'v', 'I', mm_v, NEW.id, 7, CONCAT(CONNECTION_ID(), ':0.0'), 1, NEW.name, NEW.price, NEW.qty);
  END IF;
END"""
    )


def _log_only_txn(cur: Any, natural: bool) -> None:
    """``log row only`` with the change log itself system-versioned, transaction-precise: each
    entry's ROW START names its transaction (one `mysql.transaction_registry` row at COMMIT), the
    least a capture that appends its row alone must pay to keep a source transaction together
    (docs/decisions.md "MariaDB: a capture of the change-log row alone")."""
    _log_only(cur, natural)
    cur.execute(
        "ALTER TABLE _mm_log_items ADD COLUMN mm_rs BIGINT UNSIGNED GENERATED ALWAYS AS ROW START INVISIBLE, "
        "ADD COLUMN mm_re BIGINT UNSIGNED GENERATED ALWAYS AS ROW END INVISIBLE, "
        "ADD PERIOD FOR SYSTEM_TIME (mm_rs, mm_re), ADD SYSTEM VERSIONING"
    )


def _no_ver_unique(cur: Any, natural: bool) -> None:
    """The change log's UNIQUE (ver) as a plain index (a local entry's version is its position
    formatted, unique by the primary key already)."""
    cur.execute("ALTER TABLE _mm_log_items DROP INDEX ver, ADD INDEX ver (ver)")


def _no_ver_index(cur: Any, natural: bool) -> None:
    cur.execute("ALTER TABLE _mm_log_items DROP INDEX ver")


def _no_txn_index(cur: Any, natural: bool) -> None:
    cur.execute("DROP INDEX _mm_logt_items ON _mm_log_items")


#: the key trigger's draw through a slot known to exist (dialects/mysql/dialect.py `_draw`)
_SLOT_DRAW = "UPDATE _mm_slots SET cur = (@mm_p := _mm_draw()) WHERE tbl = 'items' AND conn = CONNECTION_ID();"
_WALL = "CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED) * 65536"
_INLINE = (
    "INSERT INTO _mm_tick (t) VALUES (NULL); SET @mm_p = LAST_INSERT_ID();"
    f" IF @mm_p + 65536 < {_WALL} THEN"
    f" BEGIN DECLARE CONTINUE HANDLER FOR 1062 SET @mm_p = NULL;"
    f" SET @mm_p = {_WALL} + 32768 + MOD(CONNECTION_ID() * 40503, 32768); INSERT INTO _mm_tick (t) VALUES (@mm_p); END;"
    " IF @mm_p IS NULL THEN INSERT INTO _mm_tick (t) VALUES (NULL); SET @mm_p = LAST_INSERT_ID(); END IF;"
    " END IF;"
)


def _slot_read_locked(cur: Any, natural: bool) -> None:
    name = "_mm_cap_i_items" if natural else "_mm_rank_items"
    lock = "SELECT cur INTO @mm_c FROM _mm_slots WHERE tbl = 'items' AND conn = CONNECTION_ID() FOR UPDATE;"
    _retrigger(cur, name, lambda b: b.replace(_SLOT_DRAW, lock + " SET @mm_p = _mm_draw();", 1))


def _draw_inline(cur: Any, natural: bool) -> None:
    name = "_mm_cap_i_items" if natural else "_mm_rank_items"
    upd = "UPDATE _mm_slots SET cur = @mm_q WHERE tbl = 'items' AND conn = CONNECTION_ID();"
    _retrigger(cur, name, lambda b: b.replace(_SLOT_DRAW, "SET @mm_q = 1; " + upd + " " + _INLINE, 1))


def _both(cur: Any, natural: bool) -> None:
    name = "_mm_cap_i_items" if natural else "_mm_rank_items"
    lock = "SELECT cur INTO @mm_c FROM _mm_slots WHERE tbl = 'items' AND conn = CONNECTION_ID() FOR UPDATE;"
    _retrigger(cur, name, lambda b: b.replace(_SLOT_DRAW, lock + " " + _INLINE, 1))


def _no_triggers(cur: Any, natural: bool) -> None:
    for name in ("_mm_rank_items", "_mm_cap_i_items"):
        cur.execute(f"DROP TRIGGER IF EXISTS {name}")


VARIANTS: dict[str, Callable[[Any, bool], None] | None] = {
    "installed": None,
    "no transaction id": _no_txn_id,
    "clock lagging 4 ms": _lagging,
    "no clock catch-up": _no_catch_up,
    "no clock draw": _no_draw,
    "no gate table": _no_gate,
    "no shadow row": _no_shadow,
    "no slot": _no_slot,
    "log row only": _log_only,
    "log row + txn id": _log_only_txn,
    "slot read-locked": _slot_read_locked,
    "draw inline": _draw_inline,
    "read-locked + inline": _both,
    "ver not unique": _no_ver_unique,
    "no ver index": _no_ver_index,
    "no txn index": _no_txn_index,
    "no triggers": _no_triggers,
}


@dataclass(frozen=True)
class Load:
    """How the rows are written: `clients` connections, `rows` rows in a transaction (one INSERT
    each, or one multi-row INSERT with `one_statement`), `think` seconds of application work
    inside each transaction before COMMIT."""

    natural: bool
    clients: int = 1
    rows: int = 1
    one_statement: bool = False
    think: float = 0.0


def rate(backend: MySQLBackend, url: str, n: int, load: Load, counter: list[int]) -> float:
    """Rows inserted per second, `n` rows in all."""
    lock = threading.Lock()

    def row(i: int) -> tuple[Any, ...]:
        if not load.natural:
            return (f"r{i}", i, 0)
        with lock:
            counter[0] += 1
            return (f"k{counter[0]}", f"r{i}", i, 0)

    cols = "id, name, qty, price" if load.natural else "name, qty, price"
    # placeholders only: PyMySQL's executemany makes one multi-row INSERT of nothing else
    sql = f"INSERT INTO items ({cols}) VALUES ({', '.join(['%s'] * (4 if load.natural else 3))})"

    def work(txns: int) -> None:
        c = backend.connect(url)
        cur = c.cursor()
        for t in range(txns):
            rows = [row(t * load.rows + j) for j in range(load.rows)]
            if load.one_statement:
                cur.executemany(sql, rows)  # PyMySQL sends one multi-row INSERT
            else:
                for r in rows:
                    cur.execute(sql, r)
            if load.think:
                time.sleep(load.think)
            c.commit()
        c.close()

    txns = max(1, n // (load.clients * load.rows))
    threads = [threading.Thread(target=work, args=(txns,)) for _ in range(load.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return txns * load.clients * load.rows / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--rows", type=int, default=400, help="transactions per variant per round")
    ap.add_argument("--natural", action="store_true", help="a natural (VARCHAR) key instead of an AUTO_INCREMENT one")
    ap.add_argument("--clients", type=int, default=1, help="connections inserting at once (the rows are shared out)")
    ap.add_argument("--think-ms", type=float, default=0.0, help="application work inside each transaction")
    ap.add_argument("--rows-per-txn", type=int, default=1, help="rows in a transaction, one INSERT each")
    ap.add_argument("--one-statement", action="store_true", help="a transaction's rows in one multi-row INSERT")
    args = ap.parse_args()
    load = Load(args.natural, args.clients, args.rows_per_txn, args.one_statement, args.think_ms / 1000)
    backend = MySQLBackend()
    tables = {"items": {**ITEMS["items"], "auto": not args.natural}}
    urls: dict[str, str] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            plain = backend.new_site(Path(tmp), "plain")
            backend.create_table(plain, "items", "id", tables["items"]["columns"], not args.natural)
            urls["plain"] = plain
            for i, (name, change) in enumerate(VARIANTS.items()):
                d = Path(tmp) / f"variant{i}"  # make_cluster writes its topology file there
                d.mkdir()
                site = f"v{i}"
                cl = make_cluster(backend, d, [site, f"v{i}peer"], tables)
                urls[name] = cl.urls[site]
                if change is not None:
                    c = backend.connect(urls[name])
                    change(c.cursor(), args.natural)
                    c.commit()
                    c.close()
            counter = [0]
            names = list(urls)
            for name in names:  # warm up
                rate(backend, urls[name], 100, load, counter)
            res: dict[str, list[float]] = {n: [] for n in names}
            for _ in range(args.rounds):
                order = names[:]
                random.shuffle(order)
                for name in order:
                    res[name].append(rate(backend, urls[name], args.rows, load, counter))
            key = "natural (VARCHAR) key" if args.natural else "AUTO_INCREMENT key (renumbered)"
            how = "one multi-row INSERT" if args.one_statement else f"{args.rows_per_txn} INSERT(s)"
            who = f"{args.clients} connection(s), transactions of {how}, {args.think_ms:g} ms of think time"
            print(f"MariaDB, {who}, {key}; {args.rounds} rounds of {args.rows} rows")
            print(f"{'variant':20} {'rows/s':>8} {'÷ plain (paired)':>17} {'extra µs/row':>13}")
            for name in names:
                paired = statistics.median(x / p for x, p in zip(res[name], res["plain"]))
                extra = statistics.median(1e6 / x - 1e6 / p for x, p in zip(res[name], res["plain"]))
                print(f"{name:20} {statistics.median(res[name]):8.0f} {paired:17.3f} {extra:13.0f}")
    finally:
        backend.cleanup()


if __name__ == "__main__":
    main()
