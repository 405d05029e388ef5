"""init where every site holds the same rows, and an application writes at one of them while init
runs (docs/cli.md "multimaster init"). Before (session 34's finding): a write committed at a site
after init compared the sites' rows and before that site's capture started was captured by no one,
so it reached no other site, and init exited 0 (a lost write, the sites diverged for good). Now each
site's install checks its rows again once its writers wait; when they changed, init drops what it
installed in that run at every site and fails (BaseRowsChanged, exit 2) naming the table and the
site; run again, it compares the rows again and names the difference.

The write is forced into that moment through init's progress callback, which is told "installing
at S" just before site S's install begins."""

from __future__ import annotations

from typing import Any

import pytest
from clusters import TestCluster, make_cluster

from multimaster import api
from multimaster.engine.cluster import Cluster
from multimaster.errors import BaseRowsChanged, BaseRowsDiffer

TABLES = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}
BASE = {s: [("items", i, f"n{i}", i) for i in range(1, 21)] for s in ("a", "b", "c")}


def _write_when_installing(cl: TestCluster, site: str) -> Any:
    """A progress callback: the first time init starts installing `site`, an application there
    updates a row and commits (a plain client, its own connection)."""
    done: list[str] = []

    def say(msg: str) -> None:
        if msg == f"installing at {site}" and not done:
            cl.execute(site, "UPDATE items SET qty = 100 WHERE id = 5")
            done.append(msg)

    return say


def _nothing_installed(cl: TestCluster) -> None:
    with Cluster(cl.topo) as c:
        for n in cl.urls:
            s = c.site(n)
            with s.read() as conn:
                assert s.installed_tables(conn) == [], n
                kind = cl.backend.name
                if kind == "sqlite":
                    q = "SELECT count(*) FROM sqlite_master WHERE type = 'trigger'"
                elif kind == "postgresql":
                    q = "SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal AND tgrelid = 'items'::regclass"
                else:
                    q = "SELECT count(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE()"
                assert conn.exec_driver_sql(q).scalar() == 0, f"triggers left at {n}"


@pytest.mark.parametrize("site", ["a", "b", "c"])
def test_a_write_between_the_check_and_a_sites_install_fails_init_and_undoes_it(backend, tmp_path, site):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["a", "b", "c"], TABLES, base=BASE, init=False)
    with pytest.raises(BaseRowsChanged, match=rf"table 'items': its rows at site '{site}' changed") as e:
        api.init(cl.topo, progress=_write_when_installing(cl, site))
    assert e.value.exit_code == 2
    if site == "a":
        assert "nothing was installed" in str(e.value)
    else:
        assert "init undid what it had installed in this run at 'a'" in str(e.value)
    _nothing_installed(cl)
    # run again: the rows are compared again, and the write is named
    with pytest.raises(BaseRowsDiffer, match=r"key 5"):
        api.init(cl.topo)
    for other in ("a", "b", "c"):  # the operator makes them equal, then init
        cl.execute(other, "UPDATE items SET qty = 100 WHERE id = 5")
    api.init(cl.topo)
    cl.execute(site, "UPDATE items SET qty = 7 WHERE id = 6")
    cl.refresh_until_quiet()
    cl.assert_converged()
    assert (6, "n6", 7) in cl.rows("b", "items") and (5, "n5", 100) in cl.rows("c", "items")


def test_init_without_writes_installs_every_site_as_before(backend, tmp_path):  # type: ignore[no-untyped-def]
    cl = make_cluster(backend, tmp_path, ["a", "b", "c"], TABLES, base=BASE, init=False)
    seen: list[str] = []
    rep = api.init(cl.topo, progress=seen.append)
    assert sorted(rep.sites) == ["a", "b", "c"] and rep.base_rows["items"] == 20
    cl.execute("c", "UPDATE items SET qty = 9 WHERE id = 1")
    cl.refresh_until_quiet()
    cl.assert_converged()
