"""A mixed cluster: one SQLite, one PostgreSQL and one MariaDB site (different column types:
INTEGER vs BIGINT vs INT), in uniquely named databases dropped afterwards. Skipped when a server
does not answer; with MM_REQUIRE_SERVERS=1 that is a failure instead."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from multimaster.spark import verify
from multimaster.spark.fixtures import fill_server_site, make_sqlite_site, write_topology
from multimaster.spark.repair import apply_plan, plan_repair

from mm_spark_helpers import require_server

PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
MY_ADMIN = "mysql+pymysql://root@127.0.0.1:3306/"
ROWS = 60


def _admin(url: str) -> sa.Engine:
    return sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool, connect_args={"connect_timeout": 3})


@pytest.fixture
def pg_db():
    eng = _admin(PG_ADMIN)
    require_server("PostgreSQL", lambda: eng.connect().close())
    name = f"mm_verify_{uuid.uuid4().hex[:10]}"
    with eng.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with eng.connect() as c:
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    eng.dispose()


@pytest.fixture
def my_db():
    eng = _admin(MY_ADMIN)
    require_server("MariaDB", lambda: eng.connect().close())
    name = f"mm_verify_{uuid.uuid4().hex[:10]}"
    with eng.connect() as c:
        c.execute(sa.text(f"CREATE DATABASE `{name}`"))
    yield f"mysql+pymysql://root@127.0.0.1:3306/{name}"
    with eng.connect() as c:
        c.execute(sa.text(f"DROP DATABASE IF EXISTS `{name}`"))
    eng.dispose()


@pytest.fixture
def mixed(tmp_path, pg_db, my_db):
    names = ["s1", "pg", "my"]
    urls = {"s1": make_sqlite_site(tmp_path / "s1.db", "s1", ["pg", "my"], ROWS)}
    fill_server_site(pg_db, "pg", ["s1", "my"], ROWS)
    fill_server_site(my_db, "my", ["s1", "pg"], ROWS)
    urls["pg"], urls["my"] = pg_db, my_db
    assert list(urls) == names
    return write_topology(tmp_path / "topology.yml", urls), urls


def test_mixed_cluster_converged_diverged_repaired(spark, mixed):
    topo, urls = mixed
    res = verify(topo, spark=spark, partitions=2)
    t = res.tables["items"]
    assert res.converged, t.counts
    assert t.rows == {"s1": ROWS, "pg": ROWS, "my": ROWS}
    assert len(set(t.fingerprints.values())) == 1  # int/bigint/int and real/float8/double hash alike
    cs = verify(topo, spark=spark, checksum_only=True, buckets=8).tables["items"]
    assert cs.converged and cs.fingerprints == t.fingerprints

    pg = sa.create_engine(urls["pg"], poolclass=sa.pool.NullPool)
    my = sa.create_engine(urls["my"], poolclass=sa.pool.NullPool)
    with pg.begin() as c:
        c.execute(sa.text("UPDATE items SET qty = 1000, price = 0.5 WHERE id = 3"))
    with my.begin() as c:
        c.execute(sa.text("DELETE FROM items WHERE id = 4"))
        c.execute(sa.text("DELETE FROM _mm_shadow_items WHERE `key` = 4"))
    res = verify(topo, spark=spark)
    t = res.tables["items"]
    assert t.status == "diverged"
    assert t.counts["values"] == {"s1": 0, "pg": 1, "my": 0}
    assert t.counts["missing"] == {"s1": 0, "pg": 0, "my": 1}
    assert t.columns == {"qty": 1, "price": 1}

    plan = plan_repair(topo, "s1", spark=spark)
    assert plan.counts() == {"pg": {"items": {"delete": 0, "insert": 0, "rekey": 0, "update": 1}},
                             "my": {"items": {"delete": 0, "insert": 1, "rekey": 0, "update": 0}}}
    apply_plan(topo, plan)
    assert verify(topo, spark=spark).converged
    with my.connect() as c:
        assert c.execute(sa.text("SELECT count(*) FROM _mm_log_items")).scalar() == 0
    pg.dispose()
    my.dispose()
