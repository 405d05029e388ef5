"""Passwords with any character: written through ${VAR} inside a site URL or in a site's `password`
field, they reach the database intact, and no output, log line, error message or traceback shows
them (docs/configuration.md, "sites")."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote, quote_plus

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url

from multimaster.config import secrets
from multimaster.config.topology import hidden_url, parse_topology
from multimaster.errors import ConfigError, SiteUnreachable

HOSTILE = "p@ss/w:rd#1%2 ?&="
OTHERS = ["%41%2F", "a+b c@@d", "::::", "Pässwörd€ñ", "${NOT_A_VAR}", "quote'double\"back\\slash", "#?/@:;[]{}"]
CLI = str(Path(sys.executable).parent / "multimaster")


@pytest.fixture(autouse=True)
def _forget_passwords() -> Iterator[None]:
    """What a test makes the process remember is forgotten after it (other tests' messages stay whole)."""
    before = list(secrets._forms)
    yield
    secrets._forms[:] = before


def fragments(password: str, size: int = 4) -> set[str]:
    """Every run of `size` characters of the password and of its percent-encodings, but those of
    digits and spaces only: a log line's timestamp holds them by chance (the encoding of '%2 ' has
    '252 ', and a line logged at millisecond 252 matched it)."""
    forms = {password, quote(password, safe=""), quote(password, safe=" +"), quote_plus(password)}
    runs = {f[i : i + size] for f in forms for i in range(len(f) - size + 1)}
    return {r for r in runs if not all(c.isdigit() or c.isspace() for c in r)}


def leaked(text: str, password: str) -> list[str]:
    return sorted(f for f in fragments(password) if f in text)


def topo(url: str, **site: Any) -> Any:
    return parse_topology({"sites": {"a": {"url": url, **site}, "b": {"url": "sqlite:///b.db"}}, "tables": {"t": {"key": "id"}}})


@pytest.mark.parametrize("password", [HOSTILE, *OTHERS])
@pytest.mark.parametrize("form", ["url", "field"])
def test_a_password_with_any_character_stays_the_password(monkeypatch, password, form):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MM_TEST_PW", password)
    if form == "url":
        t = topo("postgresql+psycopg://app:${MM_TEST_PW}@db.example:6432/shop?connect_timeout=3")
    else:
        t = topo("postgresql+psycopg://app@db.example:6432/shop?connect_timeout=3", password="${MM_TEST_PW}")
    u = make_url(t.sites["a"].url)
    assert (u.username, u.password, u.host, u.port, u.database) == ("app", password, "db.example", 6432, "shop")
    assert dict(u.query) == {"connect_timeout": "3"}
    assert t.sites["a"].password is None  # once loaded, the password is in the URL only
    shown = hidden_url(t.sites["a"].url) + repr(t.sites["a"]) + str(t.sites["a"]) + repr(t)
    assert "app:***@db.example:6432/shop" in shown
    if len(password) >= secrets.MIN_LENGTH:
        assert not leaked(shown, password)


@settings(max_examples=150, deadline=None)
@given(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=30),
    st.sampled_from(["user", "password", "database", "query"]),
)
def test_any_value_lands_in_its_part_of_the_url(value, part):  # type: ignore[no-untyped-def]
    """Property: whatever the variable holds, it becomes exactly the part of the URL it is written in."""
    template = {
        "user": "mysql+pymysql://${MM_TEST_V}:pw@h:3306/db",
        "password": "mysql+pymysql://u:${MM_TEST_V}@h:3306/db",
        "database": "mysql+pymysql://u:pw@h:3306/${MM_TEST_V}",
        "query": "mysql+pymysql://u:pw@h:3306/db?ssl_ca=${MM_TEST_V}",
    }[part]
    os.environ["MM_TEST_V"] = value
    try:
        u = make_url(topo(template).sites["a"].url)
    finally:
        del os.environ["MM_TEST_V"]
    got = {"user": u.username, "password": u.password, "database": u.database, "query": u.query.get("ssl_ca")}
    assert got[part] == value
    assert (u.host, u.port) == ("h", 3306)


def test_a_whole_url_in_one_variable_is_taken_as_it_is(monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MM_TEST_URL", "postgresql+psycopg://app:p%40ss@db.example/shop")
    u = make_url(topo("${MM_TEST_URL}").sites["a"].url)
    assert (u.username, u.password, u.host, u.database) == ("app", "p@ss", "db.example", "shop")


@pytest.mark.parametrize(
    "url, site, message",
    [
        ("postgresql+psycopg://app:other@h/db", {"password": "${MM_TEST_PW}"}, "the password is given twice"),
        ("postgresql+psycopg://h/db", {"password": "${MM_TEST_PW}"}, "the url names no user"),
        ("sqlite:///a.db", {"password": "${MM_TEST_PW}"}, "names a database file, which takes no password"),
        ("postgresql+psycopg://app:x@h:${MM_TEST_PW}/db", {}, "is not a number"),
        ("postgresql+psycopg://app:x@${MM_TEST_PW}/db", {}, "does not keep its parts"),
        ("postgresql+psycopg://app:${MM_TEST_NOT_SET}@h/db", {}, "environment variable 'MM_TEST_NOT_SET' is not set"),
        ("postgresql+psycopg://app:${MM_TEST_PW}@h/db", {"password": "${MM_TEST_NOT_SET}"}, "'MM_TEST_NOT_SET' is not set"),
        ("postgresql+psycopg://app:p@ss/w:rd#1%2 ?&=@h/db", {}, "the URL has two '@'"),
    ],
)
def test_bad_password_settings_get_a_message_without_the_password(monkeypatch, url, site, message):  # type: ignore[no-untyped-def]
    monkeypatch.setenv("MM_TEST_PW", HOSTILE)
    with pytest.raises(ConfigError) as e:
        topo(url, **site)
    assert message in str(e.value) and e.value.exit_code == 2
    assert not leaked(str(e.value), HOSTILE)


def test_redact_hides_every_form_of_a_remembered_password():  # type: ignore[no-untyped-def]
    secrets.remember(HOSTILE)
    text = " | ".join([HOSTILE, quote(HOSTILE, safe=""), quote(HOSTILE, safe=" +"), quote_plus(HOSTILE), repr(HOSTILE)])
    text += " | " + json.dumps({"error": f"password={HOSTILE}"})
    out = secrets.redact(text)
    assert not leaked(out, HOSTILE) and out.count("***") == 6
    secrets.remember("abc")  # too short to search for: the text stays readable
    assert secrets.redact("abcdef") == "abcdef"


def _driver_failure(url: str) -> None:
    """What some drivers do: quote the connection string in their message."""
    try:
        raise OSError(f"connection refused for '{url}'")
    except OSError as e:
        raise SiteUnreachable("a", hidden_url(url), "see above") from e


@pytest.mark.parametrize("traceback", [False, True])
def test_cli_errors_and_tracebacks_never_show_the_password(monkeypatch, capsys, traceback):  # type: ignore[no-untyped-def]
    from multimaster.cli.common import execute

    monkeypatch.setenv("MM_TEST_PW", HOSTILE)
    url = topo("mysql+pymysql://app:${MM_TEST_PW}@h/db").sites["a"].url

    for fail in (lambda: _driver_failure(url), lambda: (_ for _ in ()).throw(RuntimeError(f"dsn {url} / {HOSTILE}"))):
        with pytest.raises(typer.Exit) as e:
            execute(fail, traceback)
        assert e.value.exit_code == 1
        out = capsys.readouterr()
        text = out.out + out.err
        assert ("Traceback (most recent call last)" in text) == traceback
        assert not leaked(text, HOSTILE), text


def test_the_daemons_log_never_shows_the_password(monkeypatch):  # type: ignore[no-untyped-def]
    from multimaster.ops.daemon import _emit, setup_logging

    monkeypatch.setenv("MM_TEST_PW", HOSTILE)
    url = topo("mysql+pymysql://app:${MM_TEST_PW}@h/db").sites["a"].url
    stream = io.StringIO()
    root = logging.getLogger("multimaster")
    handlers, level, propagate = root.handlers[:], root.level, root.propagate
    try:
        for fmt in ("text", "json"):
            setup_logging(fmt, stream=stream)
            _emit("refresh", fmt, link="a->b", error=f"OperationalError: cannot connect to {url} ({HOSTILE})")
            try:
                raise RuntimeError(f"while talking to {url}")
            except RuntimeError:
                logging.getLogger("multimaster.ops.daemon").exception("job failed")
    finally:
        root.handlers[:], root.level, root.propagate = handlers, level, propagate
    text = stream.getvalue()
    assert "refresh link=a->b error=OperationalError" in text and "job failed" in text and "RuntimeError" in text
    assert not leaked(text, HOSTILE), text


# ---- against the real servers, through the command line as a user runs it ----


def mm(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, cwd=cwd, env={**os.environ, "COLUMNS": "200", **env}, timeout=180
    )


class Login:
    """A login with a hostile password owning two fresh databases, with a table `items` in each."""

    def __init__(self, kind: str, password: str):
        from clusters import BACKENDS

        self.kind, self.password = kind, password
        self.admin = BACKENDS[kind]()  # raises ConnectionError when the server does not answer
        self.user = "mm_pw_" + uuid.uuid4().hex[:8]
        self.dbs = [f"{self.user}_s1", f"{self.user}_s2"]
        pw = password.replace("'", "''")
        if kind == "postgresql":
            self.admin._admin(f"CREATE ROLE {self.user} LOGIN PASSWORD '{pw}'")
            for db in self.dbs:
                self.admin._admin(f"CREATE DATABASE {db} OWNER {self.user}")
            self.port, self.scheme = 5432, "postgresql+psycopg"
        else:
            self.admin._admin(f"CREATE USER '{self.user}'@'%' IDENTIFIED BY '{pw}'")
            for db in self.dbs:
                self.admin._admin(f"CREATE DATABASE {db} CHARACTER SET utf8mb4")
                self.admin._admin(f"GRANT ALL ON {db}.* TO '{self.user}'@'%'")
            self.port, self.scheme = 3306, "mysql+pymysql"
        for db in self.dbs:
            self.execute(
                db,
                "CREATE TABLE items (id {} PRIMARY KEY, name TEXT)".format(
                    "SERIAL" if kind == "postgresql" else "INT AUTO_INCREMENT"
                ),
            )

    def connect(self, db: str, password: str | None = None) -> Any:
        if self.kind == "postgresql":
            import psycopg

            return psycopg.connect(host="127.0.0.1", port=5432, user=self.user, password=password or self.password, dbname=db)
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=3306, user=self.user, password=password or self.password, database=db)

    def execute(self, db: str, sql: str) -> list[tuple[Any, ...]]:
        c = self.connect(db)
        try:
            cur = c.cursor()
            cur.execute(sql)
            rows = list(cur.fetchall()) if cur.description else []
            c.commit()
            return rows
        finally:
            c.close()

    def topology(self, path: Path, port: int | None = None) -> Path:
        """s1 with the password through ${MM_PW} inside its URL, s2 with it in its password field."""
        port = port or self.port
        path.write_text(
            textwrap.dedent(
                f"""\
                sites:
                  s1: {{url: "{self.scheme}://{self.user}:${{MM_PW}}@127.0.0.1:{port}/{self.dbs[0]}"}}
                  s2: {{url: "{self.scheme}://{self.user}@127.0.0.1:{port}/{self.dbs[1]}", password: "${{MM_PW2}}"}}
                tables:
                  items: {{key: id}}
                refresh: {{interval: 200ms, jitter: 0s}}
                """
            )
        )
        return path

    def cleanup(self) -> None:
        for db in self.dbs:
            try:
                self.admin._drop(db)
            except Exception:  # noqa: BLE001 - best effort
                pass
        try:
            self.admin._admin(
                f"DROP ROLE IF EXISTS {self.user}" if self.kind == "postgresql" else f"DROP USER IF EXISTS '{self.user}'@'%'"
            )
        except Exception:  # noqa: BLE001 - best effort
            pass


@pytest.fixture(params=["postgresql", "mysql"])
def login(request: pytest.FixtureRequest) -> Iterator[Login]:
    from clusters import server_unavailable

    try:
        lg = Login(request.param, HOSTILE)
    except ConnectionError as e:
        server_unavailable(request.param, str(e))
    try:
        yield lg
    finally:
        lg.cleanup()


def assert_clean(*outputs: str) -> None:
    for text in outputs:
        assert not leaked(text, HOSTILE), text


@pytest.mark.server
def test_hostile_password_on_a_real_server(login, tmp_path):  # type: ignore[no-untyped-def]
    env = {"MM_PW": HOSTILE, "MM_PW2": HOSTILE}
    good = login.topology(tmp_path / "topology.yaml")
    from multimaster.config.topology import load_topology

    os.environ.update(env)
    try:
        t = load_topology(good)
    finally:
        for k in env:
            del os.environ[k]
    for s, db in zip(("s1", "s2"), login.dbs):
        u = make_url(t.sites[s].url)
        assert (u.username, u.password, u.host, u.port, u.database) == (login.user, HOSTILE, "127.0.0.1", login.port, db)

    r = mm("init", "-t", str(good), env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_clean(r.stdout, r.stderr)
    login.execute(login.dbs[0], "INSERT INTO items (name) VALUES ('from s1')")
    r = mm("refresh", "-t", str(good), "--until-quiet", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_clean(r.stdout, r.stderr)
    assert login.execute(login.dbs[1], "SELECT name FROM items") == [("from s1",)]
    for args in (("status",), ("status", "--json")):
        r = mm(*args, "-t", str(good), env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"{login.user}:***@127.0.0.1:{login.port}/{login.dbs[0]}" in r.stdout
        assert_clean(r.stdout, r.stderr)

    # a wrong port: every command fails or reports it, with the password nowhere
    bad = login.topology(tmp_path / "bad.yaml", port=1)
    for args in (("init", "--traceback"), ("refresh", "--traceback"), ("status", "--json"), ("init",)):
        r = mm(*args, "-t", str(bad), env=env, cwd=tmp_path)
        assert_clean(r.stdout, r.stderr)
        if args[0] == "init":
            assert r.returncode == 1 and "cannot be reached" in r.stderr
            assert ("Traceback (most recent call last)" in r.stderr) == ("--traceback" in args)
        elif args[0] == "refresh":
            assert r.returncode == 1 and "s1 → s2" in r.stdout
        else:
            assert json.loads(r.stdout)["sites"]["s1"]["reachable"] is False

    if login.kind == "mysql":  # MariaDB checks passwords: a wrong one is refused, so the right one arrived intact
        r = mm("init", "-t", str(good), "--traceback", env={"MM_PW": HOSTILE + "x", "MM_PW2": HOSTILE + "x"}, cwd=tmp_path)
        assert r.returncode == 1 and "Access denied" in r.stderr
        assert_clean(r.stdout, r.stderr)

    # the daemon's log, with one peer unreachable
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(good.read_text().replace(f":{login.port}/{login.dbs[0]}", f":1/{login.dbs[0]}"))
    log = tmp_path / "daemon.log"
    with open(log, "w") as fh:
        p = subprocess.Popen(
            [CLI, "run", "-t", str(mixed), "--site", "s2", "--traceback"],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
            cwd=tmp_path,
        )
        try:
            end = time.monotonic() + 60
            while time.monotonic() < end and "cannot be reached" not in log.read_text():
                time.sleep(0.1)
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(60)
    text = log.read_text()
    assert "cannot be reached" in text, text
    assert_clean(text)


def test_stored_errors_are_masked_where_they_are_written_and_shown(sqlite_backend, tmp_path):  # type: ignore[no-untyped-def]
    """A refresh error or a verify error stored in a bookkeeping table (an older version may have
    stored one unmasked) is shown by `status` without the password."""
    from clusters import ITEMS, make_cluster

    from multimaster import api, store
    from multimaster.engine.site import Site
    from multimaster.ops import verifications

    cl = make_cluster(sqlite_backend, tmp_path, ["s1", "s2"], ITEMS)
    secrets.remember(HOSTILE)  # as loading a topology with this password does
    site = Site("s2", cl.urls["s2"])
    with site.write() as conn:  # as stored before masking existed
        store.links.error(
            conn, site.dialect, "s1", f"OperationalError: connect to mysql://app:{HOSTILE}@h/db", "2026-01-01T00:00:00Z"
        )
    site.dispose()
    verifications.store(cl.topo, error=f"cannot read postgresql://app:{quote(HOSTILE, safe='')}@h/db")
    st = api.status(cl.topo)
    link = next(ln for ln in st["links"] if ln["from"] == "s1" and ln["to"] == "s2")
    assert link["last_error"] == "OperationalError: connect to mysql://app:***@h/db"
    assert st["verification"]["error"] == "cannot read postgresql://app:***@h/db"
    assert not leaked(json.dumps(st), HOSTILE)
