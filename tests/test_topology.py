"""The topology file: accepted forms, and one readable message per problem for broken files."""

from __future__ import annotations

import textwrap

import pytest

from multimaster.config.topology import load_topology
from multimaster.errors import ConfigError


def write(tmp_path, text):  # type: ignore[no-untyped-def]
    p = tmp_path / "t.yaml"
    p.write_text(textwrap.dedent(text))
    return p


GOOD = """
sites:
  s1: {url: "sqlite:///s1.db"}
  s2: {url: "sqlite:///s2.db"}
  s3: {url: "sqlite:///sub/s3.db"}
tables:
  items: {key: id}
links: mesh
"""


def test_the_documented_form_and_relative_paths(tmp_path):  # type: ignore[no-untyped-def]
    t = load_topology(write(tmp_path, GOOD))
    assert t.sites["s3"].url == f"sqlite:///{tmp_path}/sub/s3.db"
    assert len(t.links) == 6
    assert sorted(t.peers_of("s1")) == ["s2", "s3"]


def test_shipped_example_topology_loads():  # type: ignore[no-untyped-def]
    from pathlib import Path

    t = load_topology(Path(__file__).parent.parent / "topologies" / "three-sites.yaml")
    assert set(t.sites) == {"s1", "s2", "s3"} and t.tables["items"].key == "id"


@pytest.mark.parametrize(
    "links, pairs",
    [
        ("ring", 6),
        ({"star": "s1"}, 4),
        ({"chain": ["s1", "s2", "s3"]}, 4),
        (
            [
                {"from": "s1", "to": "s2", "interval": "5s"},
                {"from": "s2", "to": "s3"},
                {"from": "s3", "to": "s1", "cron": "*/5 * * * *"},
            ],
            3,
        ),
    ],
)
def test_link_forms(tmp_path, links, pairs):  # type: ignore[no-untyped-def]
    import yaml

    doc = yaml.safe_load(GOOD)
    doc["links"] = links
    t = load_topology(write(tmp_path, yaml.safe_dump(doc)))
    assert len(t.links) == pairs
    if isinstance(links, list):
        assert t.link("s1", "s2").interval == 5.0
        assert t.link("s3", "s1").cron == "*/5 * * * *"


def test_env_vars_in_urls(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MM_TEST_PW", "s3cret")
    t = load_topology(write(tmp_path, GOOD.replace('"sqlite:///s1.db"', '"postgresql+psycopg://app:${MM_TEST_PW}@db1/app"')))
    assert "s3cret" in t.sites["s1"].url
    from multimaster.config.topology import hidden_url

    assert "s3cret" not in hidden_url(t.sites["s1"].url)


BAD = [
    ("sites:\n  s1: {url: x}\n", "tables: required field is missing"),
    (GOOD.replace("links: mesh", "links: [{from: s1, to: s9}]"), "site 's9' is not defined under sites"),
    (GOOD.replace("items: {key: id}", "items: {}"), "tables.items.key: required field is missing"),
    (GOOD.replace("items: {key: id}", "'my items': {key: id}"), "is not a plain SQL name"),
    (GOOD.replace("s2: {url", "S1: {url"), "duplicate site name"),
    (GOOD.replace("items: {key: id}", "items: {key: id, polcy: latest}"), "unknown field"),
    (GOOD.replace("items: {key: id}", "items: {key: id, policy: newest}"), "tables.items.policy"),
    (GOOD.replace("items: {key: id}", "items: {key: id, policy: {priority: [s1, s7]}}"), "site 's7' is not defined"),
    (GOOD.replace("sqlite:///s1.db", "${MM_NOT_SET_ANYWHERE}"), "environment variable 'MM_NOT_SET_ANYWHERE' is not set"),
    (GOOD.replace("links: mesh", "links: [{from: s1, to: s2}]"), "never receives changes"),
    (GOOD.replace("items: {key: id}", "items: {key: id, exclude: [id]}"), "cannot be excluded"),
    ("sites: [", "not valid YAML"),
]


@pytest.mark.parametrize("text, message", BAD, ids=[m for _, m in BAD])
def test_broken_files_get_one_message_per_problem(tmp_path, text, message):  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as e:
        load_topology(write(tmp_path, text))
    assert message in str(e.value)
    assert e.value.exit_code == 2


def test_several_problems_are_all_reported(tmp_path):  # type: ignore[no-untyped-def]
    text = GOOD.replace("links: mesh", "links: [{from: s1, to: s9}, {from: s8, to: s1}]").replace(
        "items: {key: id}", "'x y': {key: id}"
    )
    with pytest.raises(ConfigError) as e:
        load_topology(write(tmp_path, text))
    assert len(e.value.problems) >= 3


def test_a_field_pydantic_refuses_hides_no_other_problem(tmp_path):  # type: ignore[no-untyped-def]
    """docs/configuration.md: one message per problem, also when one of them is a field of the wrong
    shape or out of range (pydantic's), which used to stop the checks before the cross-references."""
    text = """
    sites:
      a: {url: "sqlite:///a.db"}
      A: {url: "sqlite:///b.db"}
    tables: {items: {key: id, unique: {name: park}}}
    links: [{from: a, to: A}, {from: A, to: a}, {from: a, to: zz}]
    refresh: {batch_size: 0, max_clock_offset: 2s, clock_warn: 3s}
    """
    with pytest.raises(ConfigError) as e:
        load_topology(write(tmp_path, text))
    got = e.value.problems
    assert any(p.startswith("refresh.batch_size:") for p in got), got
    assert any(p.startswith("sites.A: duplicate site name") for p in got), got
    assert any(p.startswith("refresh.clock_warn:") for p in got), got
    assert any("site 'zz' is not defined" in p for p in got), got
    assert len(got) == len(set(got)) == 4, got
    assert "4 problem(s) in the topology" in str(e.value)
    # a required field refused: its own message, nothing made up besides
    with pytest.raises(ConfigError) as e:
        load_topology(write(tmp_path, "sites: {a: {}}\ntables: {items: {key: id}}\n"))
    assert e.value.problems == ["sites.a.url: required field is missing"]


def test_the_unique_policies_the_docs_give_load(tmp_path):  # type: ignore[no-untyped-def]
    for pol in ("suffix", "null", "park"):
        topo = load_topology(write(tmp_path, GOOD.replace("items: {key: id}", f"items: {{key: id, unique: {{code: {pol}}}}}")))
        assert topo.tables["items"].unique == {"code": pol}


def test_purge_retention_section(tmp_path):  # type: ignore[no-untyped-def]
    from multimaster.config.topology import parse_retention
    from multimaster.ops.purge import PurgePolicy

    t = load_topology(write(tmp_path, GOOD))
    assert PurgePolicy().after(t) == (7 * 86400.0, 30 * 86400.0)  # the defaults
    t = load_topology(write(tmp_path, GOOD + "purge: {tombstones_after: 2d, conflicts_after: 'off'}\n"))
    assert PurgePolicy().after(t) == (2 * 86400.0, float("inf"))
    assert PurgePolicy(tombstones_after=60).after(t) == (60.0, float("inf"))  # the command line wins
    assert parse_retention("OFF") == float("inf") and parse_retention("90m") == 5400.0
    with pytest.raises(ConfigError) as e:
        load_topology(write(tmp_path, GOOD + "purge: {tombstones_after: soon, conflicts_after: 3x, keep: 1}\n"))
    assert any("purge.keep" in p for p in e.value.problems)
    with pytest.raises(ConfigError) as e:
        load_topology(write(tmp_path, GOOD + "purge: {tombstones_after: soon, conflicts_after: 3x}\n"))
    assert e.value.problems == [
        "purge.tombstones_after: 'soon' is not a duration (use e.g. 500ms, 10s, 5m, 1h) or 'off'",
        "purge.conflicts_after: '3x' is not a duration (use e.g. 500ms, 10s, 5m, 1h) or 'off'",
    ]


@pytest.mark.parametrize(
    "value, seconds, problem",
    [
        (None, 5.0, None),  # the default
        ("500ms", 0.5, None),
        ("15m", 900.0, None),
        ("off", None, None),
        ("soon", None, "refresh.max_clock_offset"),
        ("0s", None, "must be more than 0"),
    ],
)
def test_max_clock_offset(tmp_path, value, seconds, problem):  # type: ignore[no-untyped-def]
    text = GOOD + ("" if value is None else f"refresh: {{max_clock_offset: {value}}}\n")
    if problem:
        with pytest.raises(ConfigError, match=problem):
            load_topology(write(tmp_path, text))
    else:
        assert load_topology(write(tmp_path, text)).refresh.max_offset_seconds() == seconds


@pytest.mark.parametrize(
    "refresh, seconds, problem",
    [
        ("", 2.5, None),  # the default: half of max_clock_offset (5 s)
        ("max_clock_offset: 1m", 30.0, None),
        ("max_clock_offset: 'off'", None, None),  # off with it
        ("clock_warn: 1s", 1.0, None),
        ("clock_warn: 'off'", None, None),
        ("{max_clock_offset: 'off', clock_warn: 2s}", 2.0, None),
        ("clock_warn: 5s", None, "refresh.clock_warn: 5 s is not below refresh.max_clock_offset"),
        ("clock_warn: soon", None, "refresh.clock_warn"),
    ],
)
def test_clock_warn(tmp_path, refresh, seconds, problem):  # type: ignore[no-untyped-def]
    body = refresh if refresh.startswith("{") else "{" + refresh + "}"
    text = GOOD + (f"refresh: {body}\n" if refresh else "")
    if problem:
        with pytest.raises(ConfigError, match=problem):
            load_topology(write(tmp_path, text))
    else:
        assert load_topology(write(tmp_path, text)).refresh.clock_warn_seconds() == seconds


def test_errors_retry_without_id_or_all_is_an_option_problem(tmp_path):  # type: ignore[no-untyped-def]
    from clusters import mm_process

    r = mm_process("errors", "retry", "-t", str(write(tmp_path, GOOD)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "1 problem(s) with the command's options" in r.stderr and "in the topology" not in r.stderr, r.stderr
    assert "--id N" in r.stderr and "--all" in r.stderr
