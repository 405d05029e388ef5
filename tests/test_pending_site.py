"""A site listed in the topology file before `add-site` ran (docs/operations.md "Adding a site",
step 2: the file, with the new site, is copied to every host first): the sites already in the
cluster go on replicating among themselves, by `refresh` and by the daemon, and `status` names the
new site as pending with the command that adds it.

Before: every site pulling from the new one read a snapshot of it that does not exist yet (`no such
table: _mm_snap_stock__s3`, `relation "_mm._mm_snap_stock__s3" does not exist`), so every
refresh into an existing site failed until the site was added or the file reverted, while `status`
exited 0 for them until `refresh.stall_after`, and told the operator to run `init` for the new site."""

from __future__ import annotations

import json
from pathlib import Path

from clusters import Backend, make_cluster, mm
from test_add_site import BASE, STOCK, grow
from test_daemon import fast_links, wait_for

from multimaster import api
from multimaster.ops.daemon import Daemon
from multimaster.ops.instantiate import add_site


def test_a_site_listed_before_add_site_does_not_stop_the_others(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], STOCK, base={"s1": BASE})
    cl.execute("s2", "UPDATE stock SET qty = qty + 1 WHERE id = 2")
    cl.refresh_until_quiet()
    big = grow(cl, tmp_path, "s3", links=fast_links(["s1", "s2", "s3"]))
    topo = str(big.topo.path)

    # by refresh: the links between s1 and s2 work, those of s3 say it is not added yet
    big.execute("s1", "INSERT INTO stock (name, qty) VALUES ('by refresh', 1)")
    big.execute("s2", "UPDATE stock SET qty = qty + 5 WHERE id = 1")
    res = {(r.peer, r.site): r for r in api.refresh(big.topo)}
    for ln in (("s1", "s2"), ("s2", "s1")):
        assert res[ln].error is None, res[ln].error  # before: no such table / relation _mm_snap_stock__s3
    assert big.rows("s2", "stock") == big.rows("s1", "stock")
    assert ("by refresh", 1) in [r[1:] for r in big.rows("s2", "stock")]
    # reconcile and the error queue's retry read the same peers
    assert set(api.reconcile(big.topo, "s2")) == {"s2"}

    # by the daemon of s2: no error on its link from s1
    big.execute("s1", "INSERT INTO stock (name, qty) VALUES ('by the daemon', 2)")
    d = Daemon(big.topo, ["s2"], purge_every=0.2)
    d.start()
    try:
        wait_for(lambda: any(r[1] == "by the daemon" for r in big.rows("s2", "stock")), "the daemon to refresh s2 from s1")
        wait_for(lambda: d.stats.purged or d.stats.purge_errors, "the purge job to run")
        st = d.stats.links["s1->s2"]
        assert st.failures == 0 and st.last_error is None, st.last_error
        assert d.stats.purge_errors == 0
    finally:
        d.stop()

    # status: s3 is pending add-site, with the command; the link s1 -> s2 is fine
    r = mm("status", "-t", topo)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out  # something needs action: add s3
    assert "multimaster add-site -t FILE s3 --from s1" in r.stderr, out
    assert "init" not in r.stderr, out  # before: "run 'multimaster init -t FILE' first"
    assert "s1 -> s2" not in r.stderr and "s2 -> s1" not in r.stderr, out
    links = {(ln["from"], ln["to"]): ln for ln in json.loads(mm("status", "-t", topo, "--json").stdout)["links"]}
    for ln in (("s1", "s2"), ("s2", "s1")):
        assert links[ln].get("error") is None and links[ln]["last_error"] is None, links[ln]
        assert links[ln]["waiting"] == 0, links[ln]
    assert "add-site -t FILE s3 --from s1" in links[("s1", "s3")]["error"]

    # then, as the docs say: add-site, and every site converges; status exits 0
    add_site(big.topo, "s3", "s1")
    big.refresh_until_quiet()
    big.assert_converged()
    r = mm("status", "-t", topo)
    assert r.returncode == 0, r.stdout + r.stderr
