"""Operators' commands that must not say "fine" while they are not (docs/cli.md "Exit codes"),
run as a user runs them against every database: `errors` and `watch --once` exit 1 while a
change is held in an error queue; `errors` and `conflicts` list a page (`--limit`, `--offset`) and
say how many more there are; the conflict listing names its table `table` as `errors` does;
`verify --traceback` exists as docs/cli.md says every command's does; after `remove-site`,
`status` and `refresh` no longer send the operator to `init` or `add-site` for the removed
site."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from clusters import Backend, TestCluster, make_cluster, mm
from test_error_queue import allow_negative_qty, reject_negative_qty

TABLES = {"items": {"key": "id", "columns": {"name": "text", "qty": "int"}}}


def _topo(tmp: Path) -> str:
    return str(tmp / "topology.yaml")


def _held_at_s2(cl: TestCluster, n: int) -> None:
    """s1 writes `n` rows s2 rejects (a CHECK there: qty >= 0): `n` changes held at s2."""
    cl.execute("s1", "INSERT INTO items (name, qty) VALUES ('ok', 1)")
    cl.refresh_until_quiet()
    reject_negative_qty(cl, "s2")
    for i in range(n):
        cl.execute("s1", f"INSERT INTO items (name, qty) VALUES ('n{i}', -1)")
    cl.refresh_until_quiet()


def test_errors_and_watch_exit_1_while_a_change_is_held(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = _topo(tmp_path)
    _held_at_s2(cl, 1)
    r = mm("errors", "-t", topo)
    assert r.returncode == 1, r.stdout + r.stderr  # before: 0, a monitoring script could not tell
    assert "failed" in r.stdout
    r = mm("errors", "-t", topo, "--json")
    assert r.returncode == 1 and [h["state"] for h in json.loads(r.stdout)] == ["failed"]
    assert mm("errors", "list", "-t", topo).returncode == 1
    assert mm("errors", "-t", topo, "--site", "s1").returncode == 0  # nothing held there
    for args in (("--once",), ("--once", "--json"), ("--json",)):
        r = mm("watch", "-t", topo, *args)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert "held in the error queue" in r.stderr and "multimaster errors" in r.stderr
    assert mm("watch", "-t", topo, "--once", "--site", "s1").returncode == 0  # s1 holds none
    # fixed and retried: every command says fine again
    allow_negative_qty(cl, "s2")
    assert mm("errors", "retry", "-t", topo, "--all").returncode == 0
    cl.refresh_until_quiet()
    r = mm("errors", "-t", topo)
    assert r.returncode == 0 and "no change is held" in r.stdout, r.stdout + r.stderr
    assert mm("errors", "-t", topo, "--all").returncode == 0  # skipped/applied history is no alarm
    r = mm("watch", "-t", topo, "--once")
    assert r.returncode == 0, r.stderr
    assert mm("status", "-t", topo).returncode == 0


def test_errors_are_listed_a_page_at_a_time(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = _topo(tmp_path)
    _held_at_s2(cl, 120)
    r = mm("errors", "-t", topo, "--json")
    assert r.returncode == 1
    first = json.loads(r.stdout)
    assert len(first) == 50, len(first)  # before: all 120
    assert "1-50 of 120" in r.stderr and "70 more" in r.stderr and "--offset 50" in r.stderr, r.stderr
    second = json.loads(mm("errors", "-t", topo, "--json", "--offset", "50").stdout)
    r = mm("errors", "-t", topo, "--json", "--offset", "100")
    last = json.loads(r.stdout)
    assert len(second) == 50 and len(last) == 20 and "101-120 of 120" in r.stderr and "more" not in r.stderr
    every = json.loads(mm("errors", "-t", topo, "--json", "--limit", "0").stdout)
    assert len(every) == 120
    assert [h["id"] for h in first + second + last] == [h["id"] for h in every]  # the same order, no overlap
    assert [h["change"]["values"]["name"] for h in every] == [f"n{i}" for i in range(120)]
    r = mm("errors", "-t", topo, "--limit", "10", "--offset", "5")
    assert r.returncode == 1 and "6-15 of 120" in r.stderr and "--offset 15" in r.stderr, r.stderr
    ids = [int(m) for m in re.findall(r"^│ s2\s+│ (\d+)", r.stdout, flags=re.M)]
    assert ids == [h["id"] for h in every[5:15]], r.stdout
    assert mm("errors", "-t", topo, "--limit", "-1").returncode == 2


def _conflicts(cl: TestCluster, n: int) -> None:
    """`n` rows each updated at s1 and at s2 before either refreshed: a conflict per row at each."""
    for i in range(n):
        cl.execute("s1", f"INSERT INTO items (name, qty) VALUES ('r{i}', 0)")
    cl.refresh_until_quiet()
    cl.execute("s1", "UPDATE items SET qty = 1")
    cl.execute("s2", "UPDATE items SET qty = 2")
    cl.refresh_until_quiet()


def test_conflicts_are_listed_a_page_at_a_time(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2"], TABLES)
    topo = _topo(tmp_path)
    _conflicts(cl, 60)
    every = json.loads(mm("conflicts", "-t", topo, "--json", "--limit", "0").stdout)
    assert len(every) == 120, len(every)  # logged at both sites
    assert all(c["table"] == c["tbl"] == "items" for c in every)  # `table`, as `errors` names it
    r = mm("conflicts", "-t", topo, "--json")
    assert r.returncode == 0
    newest = json.loads(r.stdout)
    assert "1-50 of 120" in r.stderr and "70 older" in r.stderr and "--offset 50" in r.stderr, r.stderr
    older = json.loads(mm("conflicts", "-t", topo, "--json", "--offset", "50").stdout)
    r = mm("conflicts", "-t", topo, "--json", "--offset", "100")
    oldest = json.loads(r.stdout)
    assert (len(newest), len(older), len(oldest)) == (50, 50, 20) and "101-120 of 120" in r.stderr, r.stderr
    key = lambda c: (c["site"], c["id"])  # noqa: E731
    assert [key(c) for c in oldest + older + newest] == [key(c) for c in every]  # each page oldest first, no overlap
    r = mm("conflicts", "-t", topo, "--site", "s1", "--limit", "10", "--offset", "55")
    assert r.returncode == 0 and "56-60 of 60" in r.stderr and "conflicts (5 of 60)" in r.stdout, r.stdout + r.stderr
    r = mm("conflicts", "-t", topo, "--offset", "-3")
    assert r.returncode == 2


def test_status_after_remove_site_does_not_send_to_init_or_add_site(backend: Backend, tmp_path: Path) -> None:
    cl = make_cluster(backend, tmp_path, ["s1", "s2", "s3"], TABLES)
    topo = _topo(tmp_path)
    cl.execute("s3", "INSERT INTO items (name, qty) VALUES ('a', 1)")
    cl.refresh_until_quiet()
    r = mm("remove-site", "-t", topo, "s3")
    assert r.returncode == 0, r.stdout + r.stderr
    # the file still lists s3 (the operator has not edited it yet): the commands say what to do
    for args in (("status",), ("refresh",), ("status", "--json"), ("refresh", "--json")):
        r = mm(*args, "-t", topo)
        out = r.stdout + r.stderr
        assert r.returncode == 1, (args, out)
        assert "'s3' was removed from the cluster" in out and "remove 's3' and its links" in out, (args, out)
        assert "multimaster init" not in out and "add-site" not in out, (args, out)  # before: both, for s3
    links: list[dict[str, Any]] = json.loads(mm("status", "-t", topo, "--json").stdout)["links"]
    assert {(ln["from"], ln["to"]) for ln in links if "was removed" in str(ln.get("error"))} == {
        ("s1", "s3"),
        ("s2", "s3"),
        ("s3", "s1"),
        ("s3", "s2"),
    }


def test_verify_takes_traceback_as_every_command(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.yaml")
    r = mm("verify", "-t", missing)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    r = mm("verify", "-t", missing, "--traceback")
    assert r.returncode == 2, r.stderr  # before: "No such option: --traceback"
    assert "Traceback (most recent call last)" in r.stderr and "nope.yaml" in r.stderr, r.stderr


def test_status_json_keys_are_documented(sqlite_backend: Backend, tmp_path: Path) -> None:
    """Every top-level key of `status --json` is named in docs/cli.md's `status` section (before:
    `schema_behind`, `registry_warnings` and `converging`'s neighbours were not all there)."""
    make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], TABLES)
    st = json.loads(mm("status", "-t", _topo(tmp_path), "--json").stdout)
    doc = (Path(__file__).resolve().parent.parent / "docs" / "cli.md").read_text()
    section = doc.split("### `multimaster status", 1)[1].split("\n### ", 1)[0]
    assert [k for k in st if f'"{k}"' not in section and f"`{k}`" not in section] == []
    # and every key of a link's entry, which every link has (null where not known)
    (ln, _) = st["links"]
    assert [k for k in ln if f'"{k}"' not in section and f"`{k}`" not in section] == []


def test_a_link_into_a_site_not_reached_has_every_key(sqlite_backend: Backend, tmp_path: Path) -> None:
    """A monitoring script reading `status --json` finds every link key also for a link whose
    target could not be read (before: no `waiting`, `stalled`, `behind`, and a script indexing
    them crashed), null there, the link's `error` saying why."""
    make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], TABLES)
    (tmp_path / "s2.db").rename(tmp_path / "s2.away")
    r = mm("status", "-t", _topo(tmp_path), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    links = {(ln["from"], ln["to"]): ln for ln in json.loads(r.stdout)["links"]}
    into, out_of = links[("s1", "s2")], links[("s2", "s1")]
    assert set(into) == set(out_of), set(into) ^ set(out_of)
    assert into["error"] and into["waiting"] is None and into["stalled"] is None and into["behind"] is None, into
    assert out_of["error"], out_of
