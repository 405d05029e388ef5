"""A site this host reaches through its agent (`multimaster serve` on the site's host, docs/agent.md).

:class:`AgentSite` stands where a :class:`~multimaster.engine.site.Site` stands in a cluster whose
topology file gives the site an agent url (``https://host:8470``). The agent runs the same reads a
refresher runs at a source (engine/pull.py pull_link, the purge horizon, schema versions) against
its database and sends their results; this class asks for them and hands them on in the same
shapes, so a pull through the agent is the pull from the database. Everything else that needs the
site's database (its engine, a read or write transaction) raises :class:`AgentOnly`, naming the
site and its agent: never a silent wrong result. The agent also serves, read-only, the reads of
`token` and `wait` (ops/freshness.py), the error queue's and the conflict log's listings.
"""

from __future__ import annotations

import ssl
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Connection, Engine

from multimaster.config.secrets import redact
from multimaster.config.topology import SiteConfig, Topology, hidden_url
from multimaster.core.retention import Observation
from multimaster.core.waits import Wait
from multimaster.dialects import Dialect, get_dialect
from multimaster.dialects.schema import TableInfo
from multimaster.engine import wire
from multimaster.engine.lockwatch import LockWatch
from multimaster.engine.pull import LinkRead
from multimaster.engine.site import Site
from multimaster.errors import AgentError, AgentOnly

__all__ = ["AgentSite", "TIMEOUT"]

#: seconds to connect, and between two pieces of an answer
TIMEOUT = 30.0
#: what to do after an answer broken off: a refresh's, add-site's
_AGAIN_REFRESH = "The next refresh reads it again; check that the agent runs."
_AGAIN_COPY = "add-site wrote nothing at the new site: run it again once the agent runs."

#: seconds an idle connection to an agent is reused; the agent keeps it 75 s (ops/agent.py), so a
#: request sent on it arrives before the agent closes it on links up to ~25 s one way
KEEPALIVE = 20.0


class AgentSite(Site):
    """A site read through its agent (see the module docstring)."""

    def __init__(self, name: str, cfg: SiteConfig):
        self.name = name
        self.url = cfg.url.rstrip("/")
        self.create = False
        self.cfg = cfg
        #: whether the agent's last description (describe) carried its columns' collations
        self.collations_reported = True
        self._dialect: Dialect | None = None
        self._client: Any = None
        self._infos: dict[str, TableInfo] = {}
        self._topo: Topology | None = None

    def __repr__(self) -> str:
        return f"AgentSite({self.name!r}, {hidden_url(self.url)!r})"

    @property
    def display_url(self) -> str:
        return f"agent {hidden_url(self.url)}"

    @property  # type: ignore[override]
    def dialect(self) -> Dialect:
        """The site's database kind, as its agent names it (asked once)."""
        if self._dialect is None:
            self._dialect = get_dialect(str(self.hello()["dialect"]))
        return self._dialect

    @dialect.setter
    def dialect(self, d: Dialect) -> None:
        self._dialect = d

    @property
    def engine(self) -> Engine:
        raise AgentOnly(self.name, hidden_url(self.url), "reading or writing its database")

    @contextmanager
    def read(self) -> Iterator[Connection]:
        raise AgentOnly(self.name, hidden_url(self.url), "reading its database")
        yield  # pragma: no cover

    @contextmanager
    def write(self, watch: LockWatch | None = None, *, brief: bool = False, early: bool = False) -> Iterator[Connection]:
        raise AgentOnly(self.name, hidden_url(self.url), "writing its database")
        yield  # pragma: no cover

    def dispose(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # ---- HTTP ------------------------------------------------------------------------------

    def _http(self) -> Any:
        if self._client is None:
            import httpx

            verify: Any = True
            if self.url.lower().startswith("https://"):
                verify = ssl.create_default_context(cafile=self.cfg.ca) if self.cfg.ca else ssl.create_default_context()
            self._client = httpx.Client(
                base_url=f"{self.url}/v1/{self.name}",
                headers={"Authorization": f"Bearer {self.cfg.token or ''}", "Accept": "application/json"},
                verify=verify,
                timeout=httpx.Timeout(TIMEOUT),
                limits=httpx.Limits(keepalive_expiry=KEEPALIVE),
                trust_env=False,
            )
        return self._client

    def _stream(self, path: str, body: Any, fix: str, again: str) -> Iterator[dict[str, Any]]:
        """POST `body` to `path` and yield each JSON line of the streamed answer as it arrives (a
        pull's or a copy's: head, rows, end). A refusal, an error line (`fix`: what to do) or a
        transport failure (`again`: the command to run again) raises AgentError naming the agent;
        the caller checks the end line."""
        try:
            with self._http().stream("POST", path, content=wire.dumps(body), headers={"Content-Type": "application/json"}) as r:
                if r.status_code != 200:
                    r.read()
                    self._check(r)
                for line in r.iter_lines():
                    if not line:
                        continue
                    msg = wire.loads(line)
                    if msg.get("kind") == "error":
                        raise self._fail(str(msg.get("error")), fix)
                    yield msg
        except AgentError:
            raise
        except Exception as e:  # noqa: BLE001 - every transport failure names the agent
            raise self._transport_error(e, again) from None

    def _fail(self, reason: str, fix: str | None = None) -> AgentError:
        return AgentError(self.name, hidden_url(self.url), redact(reason), fix)

    def _transport_error(self, e: Exception, again: str = _AGAIN_REFRESH) -> AgentError:
        import httpx

        text = str(e) or type(e).__name__
        if isinstance(e, httpx.ConnectError) and ("SSL" in text or "certificate" in text.lower()):
            return self._fail(
                f"TLS failed: {text}",
                "Give the agent's CA certificate as 'ca:' of the site in the topology file (a self-signed certificate), "
                "and check that the url's host is a name the certificate holds.",
            )
        if isinstance(e, (httpx.ConnectError, httpx.ConnectTimeout)):
            return self._fail(f"the agent cannot be reached: {text}")
        if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError, httpx.ReadTimeout)):
            return self._fail(f"the agent broke off its answer ({text}); nothing of it was applied", again)
        return self._fail(f"{type(e).__name__}: {text}")

    def _check(self, r: Any) -> None:
        """Raise AgentError for an answer that is not a success, naming what the agent said."""
        if r.status_code == 200:
            return
        try:
            said = str(r.json().get("error"))
        except Exception:  # noqa: BLE001 - not the agent's JSON: a proxy, another server
            said = f"HTTP {r.status_code} {r.reason_phrase}"
        if r.status_code == 401:
            raise self._fail(
                f"the agent refused the token ({said})",
                f"Give sites.{self.name}.token the token the agent of '{self.name}' checks (its own topology file's).",
            )
        if r.status_code == 404:
            raise self._fail(said, f"Point sites.{self.name}.url at the agent of '{self.name}'.")
        if r.status_code == 400:
            raise self._fail(
                f"the agent refused the request: {said}",
                "Check that this host's topology file and the agent's name the same sites and tables.",
            )
        raise self._fail(said, "")

    def _get(self, path: str, *, timeout: float | None = None, **params: Any) -> Any:
        """GET `path` with the query `params` (None: left out); `timeout`: seconds for this request
        (default TIMEOUT)."""
        kw = {} if timeout is None else {"timeout": timeout}
        try:
            r = self._http().get(path, params={k: v for k, v in params.items() if v is not None}, **kw)
        except Exception as e:  # noqa: BLE001 - every transport failure names the agent
            raise self._transport_error(e) from None
        self._check(r)
        return r.json()

    def _post(self, path: str, body: Any) -> Any:
        try:
            r = self._http().post(path, content=wire.dumps(body), headers={"Content-Type": "application/json"})
        except Exception as e:  # noqa: BLE001 - as above
            raise self._transport_error(e) from None
        self._check(r)
        return r.json()

    # ---- what the agent serves -------------------------------------------------------------

    def hello(self) -> dict[str, Any]:
        """The agent's site, its database kind, its protocol and its host's clock."""
        h = self._get("/hello")
        if h.get("site") != self.name:
            raise self._fail(f"this agent serves site '{h.get('site')}', not '{self.name}'")
        if h.get("protocol") != wire.PROTOCOL:
            raise self._fail(
                f"the agent speaks protocol {h.get('protocol')}, this multimaster {wire.PROTOCOL}",
                "Run the same multimaster version on both hosts.",
            )
        return dict(h)

    def pull_link(
        self,
        target: str,
        infos: Sequence[TableInfo],
        watermarks: Mapping[str, int],
        window: int | None = None,
        have: Mapping[str, Mapping[str, str]] | None = None,
    ) -> LinkRead:
        """engine/pull.py pull_link, run by the agent at its site for `target` (whose tables'
        layouts go along): the same LinkRead. The answer streams as JSON lines, a head, the rows
        in pieces and an end line; an answer broken off before its end line raises AgentError."""
        body: dict[str, Any] = {
            "target": target,
            "tables": [wire.layout_of(i) for i in infos],
            "watermarks": {k: int(v) for k, v in watermarks.items()},
            "window": window,
        }
        if have:  # what the target applied: sent back as positions only (an older agent ignores it)
            body["have"] = _have_out(have)
        body["trim"] = True  # rows without their trailing Nones, padded here (an older agent sends them whole)
        width = {i.name: wire.pulled_width(i) for i in infos}
        rows: dict[str, list[tuple[Any, ...]]] = {i.name: [] for i in infos}
        head: dict[str, Any] | None = None
        ended = False
        for msg in self._stream("/pull", body, "", _AGAIN_REFRESH):
            kind = msg.get("kind")
            if kind == "head":
                head = msg
            elif kind == "rows":
                w = width[msg["table"]]
                rows[msg["table"]].extend(wire.row_in(x, w) for x in msg["rows"])
            elif kind == "end":
                ended = True
                if msg.get("count") != sum(len(v) for v in rows.values()):
                    raise self._fail("the agent's answer lost rows on the way; nothing of it was applied", "")
        if head is None or not ended:
            raise self._fail(
                "the agent broke off its answer before its end; nothing of it was applied",
                "The next refresh reads it again; check that the agent runs.",
            )
        return LinkRead(
            rows,
            head["horizon"],
            head["end"],
            frozenset(tuple(wire.decode(g)) for g in head["continuing"]),
            bool(head["more"]),
            None if head.get("beyond") is None else int(head["beyond"]),  # an agent of an earlier release: None
        )

    def purge_horizon(self, table: str) -> int:
        """store/purges.py horizon at the site: the highest second-order position it purged."""
        return int(self._get("/purged", table=table)["horizon"])

    def registered_columns(self, table: str) -> list[str] | None:
        """engine/evolve.py registered_columns at the site (None: no schema versions kept)."""
        cols = self._get("/columns", table=table)["columns"]
        return None if cols is None else [str(c) for c in cols]

    def summary(self, since: str | None = None) -> dict[str, Any]:
        """ops/status.py site_summary, read by the agent."""
        return dict(self._get("/status", since=since))

    def link_at_target(self, source: str) -> dict[str, Any]:
        """ops/status.py link_at_target, read by the agent at its site (the target)."""
        d = self._get("/link", peer=source)
        return {
            "connected": bool(d["connected"]),
            "row": d["row"],
            "watermarks": {k: int(v) for k, v in d["watermarks"].items()},
            "unapplied": {k: (int(v[0]), v[1]) for k, v in d["unapplied"].items()},
            "parked": [None if w is None else Wait(**w) for w in d["parked"]],
            "have": d.get("have"),  # an older agent sends none
        }

    def link_at_source(
        self, target: str, watermarks: Mapping[str, int], have: Mapping[str, Mapping[str, str]] | None = None
    ) -> dict[str, tuple[int, str | None]]:
        """ops/status.py link_at_source, read by the agent at its site (the source)."""
        body: dict[str, Any] = {"target": target, "watermarks": dict(watermarks)}
        if have:  # an older agent ignores it and counts those too
            body["have"] = _have_out(have)
        d = self._post("/waiting", body)
        return {k: (int(v[0]), v[1]) for k, v in d.items()}

    def watermarks_held(self, source: str) -> dict[str, Any]:
        """What the site holds of `source` (purge: a puller's watermarks): installed, the link's
        last success, per table the watermark (None: none)."""
        return dict(self._get("/held", source=source))

    def observe(self) -> dict[str, Observation] | None:
        """store/fences.py observe of every table at the site (None: not installed)."""
        d = self._get("/observe")
        if d is None:
            return None
        return {tb: Observation(**o) for tb, o in d.items()}

    def token(self) -> str:
        """ops/freshness.py token_at, run by the agent at its site: its freshness token now."""
        return str(self._get("/token")["token"])

    def need(self, tok: str) -> dict[str, str | None]:
        """ops/freshness.py need_at at the site (the token's): per table the newest change of its
        own at or below `tok` (None: none)."""
        d = self._get("/need", token=tok)
        return {str(k): None if v is None else str(v) for k, v in d.items()}

    def applied_of(self, origin: str, timeout: float | None = None) -> tuple[dict[str, str], dict[str, tuple[str, int]]]:
        """ops/freshness.py applied_at at the site: per table the newest change of `origin` applied,
        and those held in its error queue (lowest version, count); within `timeout` seconds."""
        d = self._get("/applied", timeout=timeout, origin=origin)
        return (
            {str(k): str(v) for k, v in d["applied"].items()},
            {str(k): (str(v[0]), int(v[1])) for k, v in d["held"].items()},
        )

    def missing(self, applied: Mapping[str, str], need: Mapping[str, str | None]) -> tuple[dict[str, int], str | None]:
        """ops/freshness.py missing_at at the site (the token's): per table its changes a site that
        applied `applied` lacks up to `need`, and the oldest of their versions."""
        d = self._post("/missing", {"applied": dict(applied), "need": dict(need)})
        return {str(k): int(v) for k, v in d["missing"].items()}, None if d["oldest"] is None else str(d["oldest"])

    def errors(self, table: str | None = None, include_skipped: bool = False) -> list[dict[str, Any]]:
        """ops/errors.py errors_at at the site: the changes held in its error queue, values typed."""
        rows = wire.data_in(self._get("/errors", table=table, skipped="1" if include_skipped else None))
        return [dict(r) for r in rows]

    def conflicts(
        self, table: str | None = None, limit: int = 100, since: str | None = None, kind: str | None = None
    ) -> list[dict[str, Any]]:
        """ops/status.py conflicts_at at the site: its conflict log (the last `limit`, 0: all; of
        `table`, recorded at or after `since`, of `kind`), values typed."""
        rows = wire.data_in(self._get("/conflicts", table=table, limit=limit, since=since, kind=kind))
        return [dict(r) for r in rows]

    # ---- what add-site reads (ops/instantiate.py) ------------------------------------------

    def installed(self) -> list[str]:
        """The tables multimaster is installed for at the site."""
        return [str(t) for t in self._get("/installed")["tables"]]

    def error_counts(self) -> dict[str, int]:
        """store/errorqueue.py counts at the site: the changes held per state."""
        return {str(k): int(v) for k, v in self._get("/queue").items()}

    def positions(self) -> dict[str, int]:
        """Per table, ops/instantiate.py max_seq2 at the site: a position of its change log up to
        which every entry is final."""
        return {str(k): int(v) for k, v in self._get("/positions").items()}

    def describe(self) -> dict[str, TableInfo]:
        """Every replicated table as the site has it, as add-site compares it (wire.described).
        `collations_reported` says afterwards whether the agent sent its columns' collations (an
        agent older than session 36 does not: they read as comparing exactly)."""
        got = self._get("/describe")
        self.collations_reported = all(wire.collations_reported(v) for v in got.values())
        return {str(k): wire.described(v) for k, v in got.items()}

    def read_copy(
        self, target: str, tables: list[str], relayed: list[str], txn: bool, batch_size: int
    ) -> Generator[dict[str, Any], None, None]:
        """ops/instantiate.py read_copy, run by the agent at its site for new site `target`: the
        same pieces, in order, as they arrive. The answer streams as JSON lines ending with a line
        counting the rows sent; an answer broken off before it (or whose count differs) raises
        AgentError after the last piece that came, so the new site's transaction writing them
        rolls back."""
        body = {"target": target, "tables": tables, "relayed": relayed, "txn": txn, "batch_size": batch_size}
        count, ended = 0, False
        for msg in self._stream("/copy", body, _AGAIN_COPY, _AGAIN_COPY):
            if msg.get("kind") == "end":
                if msg.get("count") != count:
                    raise self._fail("the agent's answer lost rows on the way; nothing of it was written", _AGAIN_COPY)
                ended = True
                break
            piece = wire.piece_in(msg)
            if msg.get("kind") == "rows":
                count += len(piece["rows"])
            yield piece
        if not ended:
            raise self._fail("the agent broke off its answer before its end; nothing of it was written", _AGAIN_COPY)


def _have_out(have: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, str]]:
    """What a target applied (table -> origin -> version) as a request body carries it."""
    return {t: {str(o): str(v) for o, v in h.items()} for t, h in have.items()}
