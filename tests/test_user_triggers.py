"""The application's own triggers on a replicated table (docs/operations.md "Your own triggers"):
multimaster applies a peer's change with ordinary SQL, so such a trigger fires there too unless it
reads the capture guard. A "touch updated_at" trigger written as the docs show converges at every
site; one without the guard is named by init (a note on stderr, exit 0). On every database, the
triggers made and the rows written with plain DB-API clients."""

from __future__ import annotations

from pathlib import Path

from clusters import Backend, TestCluster, make_cluster, mm

from multimaster import api
from multimaster.dialects.base import unguarded_triggers


def _tickets(backend: str) -> dict[str, dict[str, object]]:
    # SQLite: TEXT, as the trigger writes it (a TIMESTAMP column's text is rewritten to the adapter's
    # six fraction digits where it is applied: the same instant, another text)
    at = "text" if backend == "sqlite" else "timestamp"
    return {"tickets": {"key": "id", "columns": {"state": "text", "updated_at": at}}}


SITES = ["s1", "s2", "s3"]


def _touch_sql(backend: str, guarded: bool) -> list[str]:
    """The docs' updated_at trigger (docs/operations.md "Your own triggers"), with its guard or without."""
    if backend == "postgresql":
        when = "WHEN (current_setting('mm.applying', true) IS DISTINCT FROM 'on') " if guarded else ""
        return [
            "CREATE OR REPLACE FUNCTION tickets_touch() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN NEW.updated_at := clock_timestamp(); RETURN NEW; END $$",
            f"CREATE TRIGGER tickets_touch BEFORE UPDATE ON tickets FOR EACH ROW {when}EXECUTE FUNCTION tickets_touch()",
        ]
    if backend == "mysql":
        body = "SET NEW.updated_at = NOW(6)"
        if guarded:
            body = f"IF coalesce(@mm_applying, 0) = 0 THEN {body}; END IF"
        return [f"CREATE TRIGGER tickets_touch BEFORE UPDATE ON tickets FOR EACH ROW {body}"]
    when = "WHEN (SELECT applying FROM _mm_state) = 0 " if guarded else ""
    return [
        f"CREATE TRIGGER tickets_touch AFTER UPDATE OF state ON tickets {when}"
        "BEGIN UPDATE tickets SET updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now') WHERE id = NEW.id; END"
    ]


def _make_triggers(cl: TestCluster, guarded: bool) -> None:
    for s in SITES:
        for sql in _touch_sql(cl.backend.name, guarded):
            cl.execute(s, sql)


def test_a_guarded_updated_at_trigger_converges_at_every_site(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, SITES, _tickets(backend.name))
    _make_triggers(cl, guarded=True)  # after init: SQLite's guard reads _mm_state, which init makes
    rep = api.init(cl.topo)
    assert not [c for cs in rep.caveats.values() for c in cs if "tickets_touch" in c], rep.caveats
    for state in ("one", "two", "three"):
        cl.execute("s1", "INSERT INTO tickets (state, updated_at) VALUES (?, '2024-01-01 00:00:00')", (state,))
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE tickets SET state = 'closed' WHERE state = 'one'")
    cl.execute("s2", "UPDATE tickets SET state = 'pending' WHERE state = 'two'")
    cl.execute("s3", "UPDATE tickets SET state = 'working' WHERE state = 'three'")
    cl.refresh_until_quiet()
    cl.assert_converged()
    rows = cl.rows("s1", "tickets")
    assert sorted(r[1] for r in rows) == ["closed", "pending", "working"]
    # each row keeps the time its origin's trigger gave it, not the base row's
    assert all(str(r[2])[:4] != "2024" for r in rows), rows


def test_init_names_an_unguarded_trigger_and_exits_0(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, SITES, _tickets(backend.name), init=False)
    _make_triggers(cl, guarded=False)
    run = mm("init", "-t", str(tmp_path / "topology.yaml"))
    assert run.returncode == 0, run.stderr
    for s in SITES:
        assert f"note: {s}: trigger tickets_touch on tickets also fires when multimaster applies a peer's change" in run.stderr
    assert '"Your own triggers"' in run.stderr
    assert "_mm_" not in run.stderr.replace("_mm_state", "")  # multimaster's own triggers are not named


def test_unguarded_triggers_are_those_not_reading_the_guard() -> None:
    texts = {
        "_mm_cap_u_t": "no guard here, but ours",
        "touch": "BEGIN SET NEW.updated_at = NOW(); END",
        "audit": "IF @MM_APPLYING IS NULL THEN INSERT INTO audit VALUES (NEW.id); END IF",
        "b_touch": "SET NEW.at = NOW()",
    }
    assert unguarded_triggers(texts, "@mm_applying") == ["b_touch", "touch"]
    assert unguarded_triggers({}, "@mm_applying") == []
