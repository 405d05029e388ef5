"""How PostgreSQL could capture inserts, measured side by side: per statement (as installed), per
row, a hybrid of both, and two designs that give up guarantees (the floor of any capture that
writes the change log and the shadow, and a Bucardo-like key-only trigger).

    .venv/bin/python benchmarks/bench_pg_insert_capture.py [--seconds 3] [--rounds 4] [--bulk 5000]

Issue #10 asks one connection without think time to capture at no less than the capture measured
when it was filed. This script says what the insert path's shape is worth against what it costs a
bulk load. One plain database and one multimaster site per variant (each the first site of a
2-site cluster nobody pulls from, the table of benchmarks/bench_concurrency.py); every variant
takes multimaster as `init` leaves it and replaces the insert capture of `items` after `init`:

- ``installed``: multimaster as `init` leaves it (an AFTER INSERT ... FOR EACH STATEMENT trigger
  over the transition table, capture.sql: a one-row statement through two plain INSERTs, a larger
  one set-based);
- ``set-based``: the same trigger with every statement captured set-based (what `init` installed
  before session 19);
- ``per row``: an AFTER INSERT ... FOR EACH ROW trigger doing the same work for NEW: registration,
  one tick, the change-log row and the shadow row (what docs/decisions.md weighed);
- ``hybrid``: a row trigger that also sees the statement's transition table: a statement of one
  row is captured as ``per row``, a larger one set-based, once, by the call for its first row;
- ``lean``: the change-log row and the shadow row only, with the clock's plain `nextval()`, no
  registration, no writers' lock, no key trigger (gives up the horizon and renumbering: a floor,
  not a design);
- ``key only``: Bucardo's design, the key into a delta table (gives up row images, versions and
  transactions: a floor, not a design).

Loads (pgbench, interleaved round by round, paired ratios to plain as in bench_concurrency.py):
single-row INSERT transactions by one connection without think time, and by 16 connections with
2 ms of think time inside each transaction. Then the bulk load: one `INSERT ... SELECT` of `--bulk`
rows per variant and round, in milliseconds. Databases are created with unique names and dropped
at the end. Figures and reading: docs/performance.md ("PostgreSQL inserts: per statement or per
row, measured again"), docs/decisions.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_concurrency import N_BASE, compare, mm_cluster, plain_site  # noqa: E402
from clusters import PostgresBackend  # noqa: E402

APPLYING = "current_setting('mm.applying', true) IS DISTINCT FROM 'on'"


def _installed(cur: Any) -> tuple[str, str, str, str]:
    """The installed insert capture of `items`, taken apart: the change log's INSERT head, its
    set-based SELECT list rewritten for one row (NEW's values, the tick mm_t, the version mm_v),
    the shadow's INSERT head, and the whole function text. Stops the run when the text moved on
    (this script then needs updating, not silently measuring something else)."""
    cur.execute("SELECT pg_get_functiondef('_mm._mm_cap_i_items'::regproc)")
    text = cur.fetchone()[0]
    log = re.search(r"(INSERT INTO _mm\.\"_mm_log_items\" \([^)]*\))\s*SELECT (.*?)\n\s*FROM \(SELECT lpad", text, re.S)
    shadow = re.search(r"(INSERT INTO _mm\.\"_mm_shadow_items\" \(rid, key[^)]*\))\s*SELECT rid, key", text)
    if not log or not shadow or "ELSIF (SELECT count(*)" not in text or "IF mm_n = 1 THEN" not in text:
        raise SystemExit("the installed insert capture of items changed shape: update this script")
    values = log.group(2).replace("n.mm_t", "mm_t").replace("n.mm_v", "mm_v").replace("n.", "NEW.")
    return log.group(1), values, shadow.group(1), text


def _row_body(cur: Any) -> str:
    """PL/pgSQL capturing NEW the way the installed statement captures each row of mm_new."""
    log_head, values, shadow_head, _ = _installed(cur)
    return (
        "IF coalesce(current_setting('mm.lo', true), '') = '' THEN PERFORM _mm._mm_register(); END IF;\n"
        "  mm_t := _mm._mm_tick();\n"
        "  mm_v := lpad(mm_t::text, 19, '0') || ':' || mm_site;\n"
        f"  {log_head} VALUES ({values});\n"
        f'  {shadow_head} VALUES (mm_v, NEW."id");'
    )


def _function(cur: Any, site: str, body: str) -> None:
    cur.execute(
        "CREATE OR REPLACE FUNCTION _mm._mm_cap_i_items() RETURNS trigger LANGUAGE plpgsql "
        "SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $f$\n"
        f"DECLARE mm_t bigint; mm_v text; mm_site text := '{site}';\nBEGIN\n  {body}\n  RETURN NULL;\nEND $f$"
    )


def _set_based(cur: Any) -> str:
    """The installed function's registration and set-based statement (sized), without its
    one-row path."""
    text = _installed(cur)[3]
    register = "IF coalesce(current_setting('mm.lo', true), '') = '' THEN PERFORM _mm._mm_register(); END IF;\n"
    tail = text.split("ELSIF (SELECT count(*)", 1)[1].rsplit("RETURN NULL;", 1)[0]
    return register + "  IF (SELECT count(*)" + tail


def set_based(cur: Any, site: str) -> None:
    body = _set_based(cur)
    _function(cur, site, body)


def per_row(cur: Any, site: str) -> None:
    body = _row_body(cur)
    cur.execute("DROP TRIGGER _mm_cap_i_items ON items")
    _function(cur, site, body)
    cur.execute(
        f"CREATE TRIGGER _mm_cap_i_items AFTER INSERT ON items FOR EACH ROW WHEN ({APPLYING}) "
        "EXECUTE FUNCTION _mm._mm_cap_i_items()"
    )


def hybrid(cur: Any, site: str) -> None:
    body = _row_body(cur)
    whole = _set_based(cur)
    cur.execute("DROP TRIGGER _mm_cap_i_items ON items")
    _function(
        cur,
        site,
        "IF NOT EXISTS (SELECT FROM mm_new OFFSET 1) THEN\n  "
        + body
        + '\n  ELSIF NEW."id" = (SELECT "id" FROM mm_new LIMIT 1) THEN\n  '
        + whole
        + "  END IF;",
    )
    cur.execute(
        "CREATE TRIGGER _mm_cap_i_items AFTER INSERT ON items REFERENCING NEW TABLE AS mm_new FOR EACH ROW "
        f"WHEN ({APPLYING}) EXECUTE FUNCTION _mm._mm_cap_i_items()"
    )


def lean(cur: Any, site: str) -> None:
    log_head, values, shadow_head, _ = _installed(cur)
    for t in ("_mm_cap_i_items", "_mm_lock_items", "_mm_rank_items"):
        cur.execute(f"DROP TRIGGER {t} ON items")
    _function(
        cur,
        site,
        "mm_t := nextval('_mm._mm_clock');\n  mm_v := lpad(mm_t::text, 19, '0') || ':' || mm_site;\n"
        f'  {log_head} VALUES ({values});\n  {shadow_head} VALUES (mm_v, NEW."id");',
    )
    cur.execute("CREATE TRIGGER _mm_cap_i_items AFTER INSERT ON items FOR EACH ROW EXECUTE FUNCTION _mm._mm_cap_i_items()")
    cur.execute("SELECT setval(pg_get_serial_sequence('items', 'id'), 1000000)")  # past the key counter's keys


def key_only(cur: Any, site: str) -> None:
    for t in ("_mm_cap_i_items", "_mm_lock_items", "_mm_rank_items"):
        cur.execute(f"DROP TRIGGER {t} ON items")
    cur.execute("CREATE TABLE delta_items (id INTEGER NOT NULL, txntime TIMESTAMPTZ NOT NULL DEFAULT now())")
    cur.execute("CREATE INDEX delta_items_t ON delta_items (txntime)")
    cur.execute(
        "CREATE FUNCTION delta_items() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN "
        "INSERT INTO delta_items (id) VALUES (NEW.id); RETURN NULL; END $f$"
    )
    cur.execute("CREATE TRIGGER delta_items AFTER INSERT ON items FOR EACH ROW EXECUTE FUNCTION delta_items()")
    cur.execute("SELECT setval(pg_get_serial_sequence('items', 'id'), 1000000)")


VARIANTS: dict[str, Callable[[Any, str], None] | None] = {
    "installed": None,
    "set-based": set_based,
    "per row": per_row,
    "hybrid": hybrid,
    "lean": lean,
    "key only": key_only,
}


def bulk(b: PostgresBackend, urls: dict[str, str], rows: int, rounds: int) -> dict[str, list[float]]:
    """Milliseconds of one INSERT ... SELECT of `rows` rows (its COMMIT not counted), per database,
    interleaved round by round."""
    out: dict[str, list[float]] = {n: [] for n in urls}
    for _ in range(rounds):
        for n, u in urls.items():
            c = b.connect(u)
            cur = c.cursor()
            t0 = time.perf_counter()
            cur.execute("INSERT INTO items (name, qty, price) SELECT 'bulk-' || g, g, 0.5 FROM generate_series(1, %s) g", (rows,))
            out[n].append((time.perf_counter() - t0) * 1000)
            c.commit()
            c.close()
    return out


def check(b: PostgresBackend, urls: dict[str, str]) -> None:
    """Every variant captured every row it was given: a shadow row per row of `items` (a delta row
    per inserted row for key only), so no figure above comes from a variant that skipped work."""
    for n, u in urls.items():
        if n == "plain":
            continue
        c = b.connect(u)
        cur = c.cursor()
        cur.execute("SELECT count(*) FROM items")
        rows = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM delta_items" if n == "key only" else 'SELECT count(*) FROM _mm."_mm_shadow_items"')
        got = cur.fetchone()[0] + (N_BASE if n == "key only" else 0)
        c.close()
        if got != rows:
            raise SystemExit(f"variant {n!r} captured {got} of {rows} rows: its figures above are not comparable")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds per pgbench run")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--bulk", type=int, default=5000, help="rows of the bulk INSERT ... SELECT")
    args = ap.parse_args()
    b = PostgresBackend()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            urls = {"plain": plain_site(b, Path(tmp))}
            for i, (name, change) in enumerate(VARIANTS.items()):
                d = Path(tmp) / f"variant{i}"
                d.mkdir()
                site = f"v{i}"
                urls[name] = mm_cluster(b, d, (site, f"v{i}peer"))[0][site]
                if change is not None:
                    c = b.connect(urls[name])
                    change(c.cursor(), site)
                    c.commit()
                    c.close()
            print(f"PostgreSQL, tps (paired ratio to plain); {args.rounds} interleaved rounds of {args.seconds:g} s")
            rows = compare(b, urls, [("insert", 1, 0.0), ("insert", 16, 2.0)], args.seconds, args.rounds)
            print(f"{'variant':12} {'x1 no think':>20} {'x16, 2 ms think':>20} {'bulk ' + str(args.bulk) + ' rows':>18}")
            ms = bulk(b, urls, args.bulk, args.rounds)
            for n in urls:
                cells = [f"{r['tps'][n]:8.0f} ({r['paired'].get(n, 1.0):.3f})" for r in rows]
                print(f"{n:12} {cells[0]:>20} {cells[1]:>20} {statistics.median(ms[n]):12.1f} ms")
            check(b, urls)
    finally:
        b.cleanup()


if __name__ == "__main__":
    main()
