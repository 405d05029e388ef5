"""The clock's warning tier (docs/clock.md "Clock discipline"): a peer whose versions come ahead of
this site's wall clock by more than refresh.clock_warn but not more than max_clock_offset is
applied, and named with its offset by `refresh` (stderr, exit 0), `status` (table and JSON) and the
metrics. The pure part (core.versions.clock_tier, ahead_warnings) is checked against its rule."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from clusters import ITEMS, Backend, make_cluster, mm
from hypothesis import given
from hypothesis import strategies as st

from multimaster import api
from multimaster.core.versions import HLC_SHIFT, ahead_warnings, clock_tier, make_ver
from multimaster.engine.site import Site
from multimaster.ops.metrics import health, render

bounds = st.one_of(st.none(), st.floats(0.001, 1e6))


@given(st.floats(-1e6, 1e6), bounds, bounds)
def test_clock_tier(ahead: float, warn: float | None, limit: float | None) -> None:
    tier = clock_tier(ahead, warn, limit)
    past_limit = limit is not None and ahead > limit
    assert (tier == "hold") == past_limit
    assert (tier == "warn") == (not past_limit and warn is not None and ahead > warn)


@given(st.lists(st.tuples(st.sampled_from(["s1", "s2", "s3"]), st.integers(-20_000, 20_000)), max_size=12), bounds, bounds)
def test_ahead_warnings_keeps_the_furthest_warned_version_per_origin(
    entries: list[tuple[str, int]], warn: float | None, limit: float | None
) -> None:
    now_ms = 1_700_000_000_000
    vers = [(o, make_ver((now_ms + d) << HLC_SHIFT, o)) for o, d in entries]
    got = ahead_warnings(vers, now_ms, warn, limit)
    want: dict[str, float] = {}
    for o, d in entries:
        if clock_tier(d / 1000, warn, limit) == "warn":
            want[o] = max(want.get(o, d / 1000), d / 1000)
    assert got == want


def test_a_peer_somewhat_ahead_is_applied_with_a_warning(backend: Backend, tmp_path: Path) -> None:
    if backend.name == "mysql":
        import pytest

        pytest.skip("the same path as PostgreSQL's; kept lean")
    cl = make_cluster(
        backend, tmp_path, ["s1", "s2"], ITEMS, settings={"refresh": {"max_clock_offset": "10m", "clock_warn": "1m"}}
    )
    topo = str(tmp_path / "topology.yaml")
    fast = Site("s2", cl.urls["s2"])
    with fast.write() as conn:  # s2's clock five minutes ahead: past the warning, within the offset
        fast.dialect.advance_clock(conn, (int(time.time() * 1000) + 5 * 60 * 1000) << HLC_SHIFT)
    fast.dispose()
    cl.execute("s2", "INSERT INTO items (name, qty, price) VALUES ('from the fast site', 1, 0)")
    r = mm("refresh", "-t", topo, "--site", "s1", "--peer", "s2")
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"clock warning: site 's2' is ([0-9.]+) s ahead of site 's1''s clock", r.stderr)
    assert m and 240 < float(m.group(1)) <= 300.05, r.stderr  # five minutes less the time since
    assert "refresh.clock_warn (60 s)" in r.stderr and "max_clock_offset (600 s)" in r.stderr
    assert [x[1] for x in cl.rows("s1", "items")] == ["from the fast site"]  # applied
    st_ = mm("status", "-t", topo, "--json")
    assert st_.returncode == 0, st_.stderr
    doc = json.loads(st_.stdout)
    assert len(doc["clock_warnings"]) == 1 and "site 's2' is" in doc["clock_warnings"][0]
    link = next(ln for ln in doc["links"] if ln["from"] == "s2" and ln["to"] == "s1")
    assert 240 < link["clock_ahead"]["s2"] < 301
    table = mm("status", "-t", topo)
    assert table.returncode == 0 and "clock warnings" in table.stdout and "site 's2' is" in table.stdout
    metrics = render(health(cl.topo))
    assert 'multimaster_clock_ahead_seconds{site="s1",peer="s2",origin="s2"} 29' in metrics
    # a refresh that pulls nothing keeps the observation; the other link has none
    assert api.refresh(cl.topo, "s1", "s2")[0].clock_warnings == []
    assert len(api.status(cl.topo)["clock_warnings"]) == 1
