"""Incoming changes are checked before they apply (docs/errors.md "Changes refused as they are
pulled"): a change-log entry pulled from a peer whose origin is no site of the topology (nor one
removed from it), or that is malformed, is held in the error queue with a message naming the peer,
the table, the entry and its origin, and the fix; the link's other changes flow. The pure
predicate is core.errorqueue.refusal, checked here against a reference model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from clusters import Backend, TestCluster, make_cluster, mm
from hypothesis import given
from hypothesis import strategies as st

from multimaster import api, store
from multimaster.core.errorqueue import MALFORMED, UNKNOWN_ORIGIN, refusal
from multimaster.engine.site import Site

TABLES = {
    "items": {"key": "id", "columns": {"name": "text", "qty": "int"}},
    "notes": {"key": "id", "columns": {"body": "text"}},
}


# ---- the pure predicate, against a reference model

SITES = ["s1", "s2", "s3", "old"]
names = st.sampled_from(["s1", "s2", "s3", "old", "s9", "x_y", ""])
versions = st.one_of(
    st.builds(lambda h, s: "%019d:%s" % (h, s), st.integers(0, 10**19 - 1), names),
    st.text(max_size=25),
    st.none(),
    st.integers(),
)


def model(ver: Any, origin: Any, op: Any, rid: Any, mask: Any, known: set[str]) -> str | None:
    """What the predicate must say, written independently: the kind of refusal, or None."""
    well = (
        isinstance(ver, str)
        and len(ver) > 20
        and ver[:19].isascii()
        and ver[:19].isdigit()
        and ver[19] == ":"
        and ver[20:].isascii()
        and ver[20:].isidentifier()
        and isinstance(origin, str)
        and origin != ""
        and op in ("I", "U", "D")
        and isinstance(rid, str)
        and rid != ""
        and type(mask) is int
        and mask >= 0
        and ver[20:] == origin
    )
    if not well:
        return MALFORMED
    return None if origin in known else UNKNOWN_ORIGIN


@given(
    versions,
    st.one_of(names, st.none()),
    st.sampled_from(["I", "U", "D", "X", "", None, "i"]),
    st.sampled_from(["r1", "", None, "k:7"]),
    st.one_of(st.integers(-2, 9), st.none(), st.booleans()),
    st.sets(st.sampled_from(SITES)),
)
def test_refusal_agrees_with_the_model(ver: Any, origin: Any, op: Any, rid: Any, mask: Any, known: set[str]) -> None:
    got = refusal(ver, origin, op, rid, mask, known)
    want = model(ver, origin, op, rid, mask, known)
    assert (got[0] if got else None) == want, (got, want)
    if got is not None:
        assert got[1]  # always a reason
        if got[0] == UNKNOWN_ORIGIN:
            assert f"'{origin}'" in got[1]


def test_refusal_names_the_origin_and_the_mismatch() -> None:
    assert refusal("0000000000000000001:s1", "s1", "U", "r", 1, {"s1"}) is None
    kind, why = refusal("0000000000000000001:s9", "s9", "U", "r", 1, {"s1", "s2"}) or ("", "")
    assert kind == UNKNOWN_ORIGIN and "origin 's9' is not a site of the topology" in why
    kind, why = refusal("0000000000000000001:s9", "s1", "U", "r", 1, {"s1", "s9"}) or ("", "")
    assert kind == MALFORMED and "names site 's9'" in why


# ---- on the databases: a corrupt or hostile peer's entry


def _hack_newest(cl: TestCluster, site: str, table: str, origin: str, suffix: str) -> None:
    """Give the newest entry of `site`'s change log of `table` the origin `origin` and a version
    naming `suffix`, by hand (as a corrupt or hostile peer would)."""
    d = Site(site, cl.urls[site]).dialect
    log = d.obj(table).log
    ver = "substr(ver, 1, 20) || '{}'" if cl.backend.name != "mysql" else "CONCAT(substr(ver, 1, 20), '{}')"
    cl.execute(
        site,
        f"UPDATE {log} SET origin = '{origin}', ver = {ver.format(suffix)} "
        f"WHERE seq = (SELECT m FROM (SELECT max(seq) AS m FROM {log}) x)",
    )


def test_an_entry_of_an_unknown_origin_is_held_and_the_link_flows(backend: Backend, tmp_path: Path) -> None:
    if backend.name == "mysql":
        pytest.skip("the same path as PostgreSQL's; kept lean")
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = str(tmp_path / "topology.yaml")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('apple', 1)")
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('pear', 2)")
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE items SET qty = 5 WHERE name = 'apple'")
    _hack_newest(cl, "s1", "items", "s9", "s9")  # a site the topology does not know
    cl.execute("s1", "UPDATE items SET qty = 6 WHERE name = 'apple'")  # waits behind it: same row
    cl.execute("s1", "UPDATE items SET qty = 8 WHERE name = 'pear'")
    cl.execute("s1", "INSERT INTO notes (body) VALUES ('before the bad one')")
    _hack_newest(cl, "s1", "notes", "s1", "s7")  # malformed: its version names another site
    cl.execute("s1", "INSERT INTO notes (body) VALUES ('still flowing')")
    cl.refresh_until_quiet()  # no link error
    assert cl.rows("s2", "items") == [(1, "apple", 1), (2, "pear", 8)]
    assert [r[1] for r in cl.rows("s2", "notes")] == ["still flowing"]
    r = mm("errors", "-t", topo, "--json", "--site", "s2")
    held = json.loads(r.stdout)
    by = {(h["table"], h["state"]): h for h in held}
    alien = by[("items", "failed")]
    for part in ("peer 's1'", "table 'items'", "entry ", "origin 's9'", "not a site of the topology", "errors retry"):
        assert part in alien["error"], alien["error"]
    assert alien["origin"] == "s9" and alien["change"] is not None  # stored: retry can apply it
    assert by[("items", "waiting")]["blocked_by"] == alien["id"]
    bad = by[("notes", "failed")]
    assert bad["op"] == "?" and "names site 's7'" in bad["error"] and "errors skip" in bad["error"]
    st_ = mm("status", "-t", topo)
    assert st_.returncode == 1 and "held in the error queue" in st_.stderr
    # still unknown: a retry keeps it held (exit 1), with its message
    r = mm("errors", "retry", "-t", topo, "--site", "s2", "--id", str(alien["id"]))
    assert r.returncode == 1 and "s9" in r.stdout, r.stdout
    assert cl.rows("s2", "items")[0] == (1, "apple", 1)
    # s9 turns out to be a site removed from the cluster: its change on its way is applied
    s2 = Site("s2", cl.urls["s2"])
    with s2.write() as conn:
        store.retired.record(conn, s2.dialect, "s9", "2026-01-01T00:00:00Z")
    s2.dispose()
    r = mm("errors", "retry", "-t", topo, "--site", "s2", "--id", str(alien["id"]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert cl.rows("s2", "items") == [(1, "apple", 6), (2, "pear", 8)]
    assert mm("errors", "skip", "-t", topo, "--site", "s2", "--id", str(bad["id"]), "--reason", "bad").returncode == 0
    assert api.list_errors(cl.topo) == []
    assert mm("status", "-t", topo).returncode == 0


def test_changes_of_a_removed_site_on_their_way_still_apply(sqlite_backend: Backend, tmp_path: Path) -> None:
    """A star around s1: s3's change reaches s1, then s3 is removed (--force: s2 has not pulled it
    yet). Relayed by s1 after s3 left the topology file, it is applied at s2, not refused: remove-site
    recorded s3 as removed at every site."""
    import yaml

    from multimaster.config.topology import load_topology
    from multimaster.ops.instantiate import remove_site

    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2", "s3"], TABLES, links={"star": "s1"})
    cl.execute("s3", "INSERT INTO notes (body) VALUES ('from s3')")
    cl.refresh("s1", "s3")
    rep = remove_site(cl.topo, "s3", force=True)
    assert "'s3' recorded as removed" in rep.cleaned["s2"]
    doc = yaml.safe_load(Path(cl.topo.path).read_text())
    del doc["sites"]["s3"]
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = api.refresh(load_topology(small), "s2")
    assert [r.error for r in res] == [None]
    assert [r[1] for r in cl.rows("s2", "notes")] == ["from s3"]
    assert api.list_errors(load_topology(small)) == []


def test_an_unknown_operation_never_applies(backend: Backend, tmp_path: Path) -> None:
    """SQLite's and MariaDB's change logs refuse an op other than I, U, D (a CHECK; MariaDB's since
    this version: a site installed before keeps its change log as it was). PostgreSQL's has no
    CHECK (preparing it cost every captured row 30,000 instructions, docs/decisions.md) and `init`
    drops the one of earlier versions: there the entry goes in, and the peer holds it in its error
    queue as malformed, naming the op, while the link's other changes flow."""
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], {"notes": TABLES["notes"]})
    topo = str(tmp_path / "topology.yaml")
    cl.execute("s1", "INSERT INTO notes (body) VALUES ('x')")
    log = Site("s1", cl.urls["s1"]).dialect.obj("notes").log
    if backend.name != "postgresql":
        with pytest.raises(Exception, match="(?i)check|constraint"):
            cl.execute("s1", f"UPDATE {log} SET op = 'X'")
        return
    c = cl.db("s1")
    try:  # a change log made by an earlier version: init drops its CHECK
        cur = c.cursor()
        cur.execute(f"ALTER TABLE {log} ADD CHECK (op IN ('I', 'U', 'D'))")
        c.commit()
    finally:
        c.close()
    assert mm("init", "-t", topo).returncode == 0
    cl.execute("s1", f"UPDATE {log} SET op = 'X'")
    cl.execute("s1", "INSERT INTO notes (body) VALUES ('still flowing')")
    cl.refresh_until_quiet()  # no link error
    assert [r[1] for r in cl.rows("s2", "notes")] == ["still flowing"]
    held = json.loads(mm("errors", "-t", topo, "--json", "--site", "s2").stdout)
    assert len(held) == 1 and "op='X'" in held[0]["error"] and "errors skip" in held[0]["error"], held
