"""Small clusters with the documented table layout (docs/concepts.md), for verify's tests and
benchmark while the core engine's `init` is not there to build them.

Each site gets `items(id, name, qty, price)` (or `items(id BIGINT ...)` at server sites, to test
the canonical schema), `_mm_state`, `_mm_shadow_items`, `_mm_log_items`, `_mm_log2_items`,
`_mm_watermarks` and `_mm_snap_items__<peer>`; SQLite sites also get capture triggers with the
echo guard, so writes with `applying = 0` are logged and writes with `applying = 1` are not.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import sqlalchemy as sa
import yaml

__all__ = ["rid", "make_sqlite_site", "write_topology", "make_sqlite_cluster", "sql_site", "server_ddl", "fill_server_site"]

TABLE = "items"


def rid(i: int, origin: str = "s1") -> str:
    return f"{1_000_000 + i:019d}:{origin}"


SQLITE_DDL = """
PRAGMA journal_mode=WAL;
CREATE TABLE items(id INTEGER PRIMARY KEY, name TEXT, qty INTEGER, price REAL);
CREATE TABLE _mm_state(site TEXT NOT NULL, applying INTEGER NOT NULL DEFAULT 0, hlc INTEGER NOT NULL DEFAULT 0);
CREATE TABLE _mm_tables(tbl TEXT PRIMARY KEY, key_col TEXT, renumber INTEGER, columns TEXT, base_max INTEGER, caught_up INTEGER NOT NULL DEFAULT 0);
CREATE TABLE _mm_shadow_items(rid TEXT PRIMARY KEY, key INTEGER UNIQUE, deleted TEXT, v_name TEXT, v_qty TEXT, v_price TEXT);
CREATE TABLE _mm_log_items(seq INTEGER PRIMARY KEY AUTOINCREMENT, ver TEXT UNIQUE, origin TEXT, op TEXT, rid TEXT, key INTEGER, mask INTEGER);
CREATE TABLE _mm_log2_items(seq2 INTEGER PRIMARY KEY AUTOINCREMENT, seq INTEGER, op TEXT);
CREATE TABLE _mm_watermarks(peer TEXT, tbl TEXT, seq2 INTEGER NOT NULL DEFAULT 0, pulled_at TEXT, PRIMARY KEY(peer, tbl));
CREATE TRIGGER _mm_cap_i_items AFTER INSERT ON items WHEN (SELECT applying FROM _mm_state) = 0 BEGIN
  UPDATE _mm_state SET hlc = max(hlc + 1, 2000000000);
  INSERT INTO _mm_shadow_items(rid, key, v_name, v_qty, v_price)
    SELECT printf('%019d:%s', hlc, site), NEW.id, printf('%019d:%s', hlc, site), printf('%019d:%s', hlc, site), printf('%019d:%s', hlc, site) FROM _mm_state;
  INSERT INTO _mm_log_items(ver, origin, op, rid, key, mask)
    SELECT printf('%019d:%s', hlc, site), site, 'I', printf('%019d:%s', hlc, site), NEW.id, 7 FROM _mm_state;
END;
CREATE TRIGGER _mm_cap_u_items AFTER UPDATE ON items WHEN (SELECT applying FROM _mm_state) = 0 BEGIN
  UPDATE _mm_state SET hlc = max(hlc + 1, 2000000000);
  INSERT INTO _mm_log_items(ver, origin, op, rid, key, mask)
    SELECT printf('%019d:%s', hlc, site), site, 'U', (SELECT rid FROM _mm_shadow_items WHERE key = NEW.id), NEW.id, 7 FROM _mm_state;
END;
CREATE TRIGGER _mm_cap_d_items AFTER DELETE ON items WHEN (SELECT applying FROM _mm_state) = 0 BEGIN
  UPDATE _mm_state SET hlc = max(hlc + 1, 2000000000);
  INSERT INTO _mm_log_items(ver, origin, op, rid, key, mask)
    SELECT printf('%019d:%s', hlc, site), site, 'D', (SELECT rid FROM _mm_shadow_items WHERE key = OLD.id), OLD.id, 0 FROM _mm_state;
  UPDATE _mm_shadow_items SET deleted = (SELECT printf('%019d:%s', hlc, site) FROM _mm_state) WHERE key = OLD.id;
END;
CREATE TRIGGER _mm_l2a_items AFTER INSERT ON _mm_log_items BEGIN
  INSERT INTO _mm_log2_items(seq, op) VALUES (NEW.seq, 'A');
END;
"""

SNAP_DDL = "CREATE TABLE IF NOT EXISTS {name}(pseq INTEGER PRIMARY KEY, ver TEXT, origin TEXT, op TEXT, rid TEXT, key INTEGER, mask INTEGER, applied INTEGER NOT NULL DEFAULT 0)"


def _row(i: int) -> tuple:
    return (i, f"item {i}", i % 97, round(i * 0.25, 2))


def _shadow(i: int) -> tuple:
    v = rid(i)
    return (v, i, None, v, v, v)


def make_sqlite_site(path: Path, site: str, peers: list[str], rows: int) -> str:
    """Create one SQLite site holding rows 1..rows; returns its SQLAlchemy URL."""
    path = Path(path)
    if path.exists():
        path.unlink()
    c = sqlite3.connect(path, isolation_level=None)
    try:
        c.executescript(SQLITE_DDL)
        c.execute("INSERT INTO _mm_state(site, applying, hlc) VALUES (?, 0, 1000000000)", (site,))
        c.execute("INSERT INTO _mm_tables VALUES ('items', 'id', 1, '[\"name\",\"qty\",\"price\"]', 0, 0)")
        c.execute("BEGIN")
        c.execute("UPDATE _mm_state SET applying = 1")
        step = 200_000
        for lo in range(1, rows + 1, step):
            hi = min(rows, lo + step - 1)
            c.executemany("INSERT INTO items VALUES (?,?,?,?)", (_row(i) for i in range(lo, hi + 1)))
            c.executemany("INSERT INTO _mm_shadow_items VALUES (?,?,?,?,?,?)", (_shadow(i) for i in range(lo, hi + 1)))
        c.execute("UPDATE _mm_state SET applying = 0")
        c.execute("COMMIT")
        for p in peers:
            c.execute(SNAP_DDL.format(name=f"_mm_snap_items__{p}"))
            c.execute("INSERT INTO _mm_watermarks(peer, tbl, seq2) VALUES (?, 'items', 0)", (p,))
    finally:
        c.close()
    return f"sqlite:///{path}"


def write_topology(path: Path, urls: dict[str, str], links: object = "mesh", extra_tables: dict | None = None) -> Path:
    doc = {
        "sites": {s: {"url": u} for s, u in urls.items()},
        "tables": {"items": {"key": "id"}, **(extra_tables or {})},
        "links": links,
    }
    Path(path).write_text(yaml.safe_dump(doc, sort_keys=False))
    return Path(path)


def make_sqlite_cluster(directory: Path, n_sites: int = 3, rows: int = 100) -> Path:
    """n SQLite sites s1..sn (mesh) with identical rows; returns the topology path.
    The first site is built, the others are file copies with their own _mm_state/peers."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    names = [f"s{i + 1}" for i in range(n_sites)]
    first = d / "s1.db"
    make_sqlite_site(first, "s1", names[1:], rows)
    urls = {"s1": f"sqlite:///{first}"}
    for s in names[1:]:
        p = d / f"{s}.db"
        for suffix in ("-wal", "-shm"):
            Path(str(p) + suffix).unlink(missing_ok=True)
        shutil.copyfile(first, p)
        c = sqlite3.connect(p, isolation_level=None)
        c.execute("UPDATE _mm_state SET site = ?", (s,))
        c.execute("DELETE FROM _mm_watermarks")
        for t in [n for n in c.execute("SELECT name FROM sqlite_master WHERE name LIKE '\\_mm\\_snap\\_%' ESCAPE '\\'")]:
            c.execute(f"DROP TABLE {t[0]}")
        for peer in names:
            if peer != s:
                c.execute(SNAP_DDL.format(name=f"_mm_snap_items__{peer}"))
                c.execute("INSERT INTO _mm_watermarks(peer, tbl, seq2) VALUES (?, 'items', 0)", (peer,))
        c.close()
        urls[s] = f"sqlite:///{p}"
    return write_topology(d / "topology.yml", urls)


def sql_site(path_or_url: str | Path) -> sqlite3.Connection:
    """A plain sqlite3 connection (autocommit) to a SQLite site, for test edits."""
    s = str(path_or_url)
    if s.startswith("sqlite:///"):
        s = s[len("sqlite:///"):]
    return sqlite3.connect(s, isolation_level=None)


# ---- PostgreSQL / MariaDB sites (no triggers: verify only reads them) ----

def server_ddl(dialect: str, peers: list[str]) -> list[str]:
    if dialect == "postgresql":
        p = "_mm."
        stmts = [
            "CREATE SCHEMA IF NOT EXISTS _mm",
            "CREATE TABLE items(id BIGINT PRIMARY KEY, name VARCHAR(100), qty BIGINT, price DOUBLE PRECISION)",
            f"CREATE TABLE {p}_mm_state(site TEXT NOT NULL, applying INTEGER NOT NULL DEFAULT 0, hlc BIGINT NOT NULL DEFAULT 0)",
            f'CREATE TABLE {p}_mm_shadow_items(rid TEXT PRIMARY KEY, "key" BIGINT UNIQUE, deleted TEXT, v_name TEXT, v_qty TEXT, v_price TEXT)',
            f'CREATE TABLE {p}_mm_log_items(seq BIGSERIAL PRIMARY KEY, ver TEXT UNIQUE, origin TEXT, op TEXT, rid TEXT, "key" BIGINT, mask BIGINT)',
            f"CREATE VIEW {p}_mm_log2_items AS SELECT seq AS seq2, seq, 'A'::char(1) AS op FROM {p}_mm_log_items",
            f"CREATE TABLE {p}_mm_watermarks(peer TEXT, tbl TEXT, seq2 BIGINT NOT NULL DEFAULT 0, pulled_at TEXT, PRIMARY KEY(peer, tbl))",
        ]
        snap = f'CREATE TABLE {p}"_mm_snap_items__{{peer}}"(pseq BIGINT PRIMARY KEY, ver TEXT, origin TEXT, op TEXT, rid TEXT, "key" BIGINT, mask BIGINT, applied INTEGER NOT NULL DEFAULT 0)'
    else:
        stmts = [
            "CREATE TABLE items(id INT PRIMARY KEY, name VARCHAR(100), qty INT, price DOUBLE)",
            "CREATE TABLE _mm_state(site VARCHAR(64) NOT NULL, applying INT NOT NULL DEFAULT 0, hlc BIGINT NOT NULL DEFAULT 0)",
            "CREATE TABLE _mm_shadow_items(rid VARCHAR(100) PRIMARY KEY, `key` BIGINT UNIQUE, deleted VARCHAR(100), v_name VARCHAR(100), v_qty VARCHAR(100), v_price VARCHAR(100))",
            "CREATE TABLE _mm_log_items(seq BIGINT AUTO_INCREMENT PRIMARY KEY, ver VARCHAR(100) UNIQUE, origin VARCHAR(64), op CHAR(1), rid VARCHAR(100), `key` BIGINT, mask BIGINT)",
            "CREATE VIEW _mm_log2_items AS SELECT seq AS seq2, seq, 'A' AS op FROM _mm_log_items",
            "CREATE TABLE _mm_watermarks(peer VARCHAR(64), tbl VARCHAR(64), seq2 BIGINT NOT NULL DEFAULT 0, pulled_at VARCHAR(40), PRIMARY KEY(peer, tbl))",
        ]
        snap = "CREATE TABLE `_mm_snap_items__{peer}`(pseq BIGINT PRIMARY KEY, ver VARCHAR(100), origin VARCHAR(64), op CHAR(1), rid VARCHAR(100), `key` BIGINT, mask BIGINT, applied INT NOT NULL DEFAULT 0)"
    return stmts + [snap.format(peer=p_) for p_ in peers]


def fill_server_site(url: str, site: str, peers: list[str], rows: int) -> None:
    """Create the layout in an empty PostgreSQL/MariaDB database and fill rows 1..rows."""
    eng = sa.create_engine(url, poolclass=sa.pool.NullPool)
    dialect = "postgresql" if eng.dialect.name == "postgresql" else "mysql"
    p = "_mm." if dialect == "postgresql" else ""
    kq = '"key"' if dialect == "postgresql" else "`key`"
    with eng.begin() as c:
        for st in server_ddl(dialect, peers):
            c.execute(sa.text(st))
        c.execute(sa.text(f"INSERT INTO {p}_mm_state(site, applying, hlc) VALUES (:s, 0, 1000000000)"), {"s": site})
        c.execute(sa.text("INSERT INTO items(id, name, qty, price) VALUES (:a, :b, :c, :d)"),
                  [dict(zip("abcd", _row(i))) for i in range(1, rows + 1)])
        c.execute(sa.text(f"INSERT INTO {p}_mm_shadow_items(rid, {kq}, deleted, v_name, v_qty, v_price) VALUES (:a, :b, :c, :d, :e, :f)"),
                  [dict(zip("abcdef", _shadow(i))) for i in range(1, rows + 1)])
        for peer in peers:
            c.execute(sa.text(f"INSERT INTO {p}_mm_watermarks(peer, tbl, seq2) VALUES (:p, 'items', 0)"), {"p": peer})
    eng.dispose()
