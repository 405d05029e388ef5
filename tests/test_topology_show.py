"""The example topologies load, and `topology show` draws their links and relay hops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from multimaster.cli import app
from multimaster.config.topology import load_topology
from multimaster.config.view import render_text, view

TOPOLOGIES = Path(__file__).parent.parent / "topologies"

# file -> (sites, links, longest path in hops)
EXPECTED = {
    "mesh.yaml": (4, 12, 1),
    "star.yaml": (5, 8, 2),
    "chain.yaml": (4, 6, 3),
    "ring.yaml": (6, 12, 3),
    "hierarchical.yaml": (9, 18, 3),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_topologies(name):  # type: ignore[no-untyped-def]
    v = view(load_topology(TOPOLOGIES / name))
    sites, links, diameter = EXPECTED[name]
    assert (len(v.sites), len(v.links), v.diameter) == (sites, links, diameter)
    assert all(h is not None for row in v.hops.values() for h in row.values())  # everyone reaches everyone
    text = (TOPOLOGIES / name).read_text()
    assert text.startswith("#") and "Trade-off" in text and "hops" in text.lower()


def test_hops_and_routes_of_a_star():  # type: ignore[no-untyped-def]
    v = view(load_topology(TOPOLOGIES / "star.yaml"))
    assert v.hops["hq"]["store_1"] == 1
    assert v.hops["store_1"]["store_2"] == 2
    assert v.route["store_1"]["store_2"] == ["store_1", "hq", "store_2"]
    assert v.pulls_from("store_1") == ["hq"]
    # worst delay: two links of 5 s interval + 1 s jitter
    assert v.delay["store_1"]["store_2"] == 12


def test_cron_links_count_their_longest_gap():  # type: ignore[no-untyped-def]
    v = view(load_topology(TOPOLOGIES / "hierarchical.yaml"))
    assert 23 * 3600 <= v.delay["asia"]["asia_1"] - 1 <= 25 * 3600  # one night (+ 1 s jitter)
    assert "asia_1 <- asia (cron 0 2 * * *)" in render_text(v)


def test_topology_show_command():  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(app, ["topology", "show", "-t", str(TOPOLOGIES / "chain.yaml")])
    assert r.exit_code == 0, r.output
    assert "relay hops" in r.output and "longest path: 3 hop(s)" in r.output
    r = CliRunner().invoke(app, ["topology", "show", "-t", str(TOPOLOGIES / "ring.yaml"), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["diameter"] == 3 and data["hops"]["n1"]["n4"] == 3 and data["hops"]["n1"]["n2"] == 1
