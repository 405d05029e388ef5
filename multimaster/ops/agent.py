"""The site agent: `multimaster serve` (docs/agent.md).

It runs next to one site and serves, over HTTP(S), what peers on other hosts read of that site:
its change log past a watermark (engine/pull.py pull_link run here, for the target's layout the
client sends, so the entries are those a direct pull computes), its purge horizon, its schema
versions, what status and purge read of it, and its clock. It writes nothing: every endpoint runs
in a read transaction. Each request carries the site's token (`token:` of the site's entry in this
host's topology file) as a bearer token, compared in constant time.

Endpoints (all under ``/v1/<site>``): ``GET /hello``, ``POST /pull`` (JSON lines: a head, the rows
in pieces of ROWS_PER_LINE, an end line with the count), ``GET /purged?table=``, ``GET
/columns?table=``, ``GET /status[?since=]``, ``GET /link?peer=``, ``POST /waiting``, ``GET
/held?source=``, ``GET /observe``; for `token` and `wait` (ops/freshness.py) ``GET /token``, ``GET
/need?token=``, ``GET /applied?origin=``, ``POST /missing``; the listings of `errors` and
`conflicts`: ``GET /errors[?table=&skipped=1]``, ``GET /conflicts[?table=&limit=&since=&kind=]``;
and what add-site reads of a site it copies or whose tables it checks: ``GET /installed``, ``GET /queue``, ``GET /positions``, ``GET /describe``, ``POST
/copy`` (ops/instantiate.py read_copy's pieces as JSON lines, an end line with the count).
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Generator, Iterator, Mapping
from dataclasses import asdict
from typing import Any, Callable

from multimaster import store
from multimaster.config.secrets import redact
from multimaster.config.topology import IDENT, Topology, is_loopback
from multimaster.engine import wire
from multimaster.engine.evolve import registered_columns
from multimaster.engine.pull import pull_link
from multimaster.engine.site import Site
from multimaster.errors import ConfigError, MultimasterError
from multimaster.ops.errors import errors_at
from multimaster.ops.freshness import applied_at, check_token, missing_at, need_at, token_at
from multimaster.ops.instantiate import CopyRequest, max_seq2, read_copy
from multimaster.ops.status import CONFLICT_KINDS, conflicts_at, link_at_source, link_at_target, site_summary

__all__ = ["make_app", "make_server", "serve", "parse_listen", "ROWS_PER_LINE", "DEFAULT_PORT"]

log = logging.getLogger("multimaster.agent")

#: rows per JSON line of a pull's answer
ROWS_PER_LINE = 500
#: the largest window (entries per table) a pull may ask for: the agent holds one window in memory
#: (a refresh asks for 4 x refresh.batch_size, at most 1,000,000 each)
MAX_WINDOW = 4_000_000
DEFAULT_PORT = 8470
#: the most rows per piece of add-site's copy (its --batch-size): the agent holds one piece in memory
MAX_COPY_BATCH = 100_000


def parse_listen(listen: str) -> tuple[str, int]:
    """'HOST:PORT' (or '[::1]:PORT', or ':PORT' for every address) -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError([f"--listen: '{listen}' is not HOST:PORT (e.g. 0.0.0.0:{DEFAULT_PORT} or 127.0.0.1:{DEFAULT_PORT})"])
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def _check_serving(topo: Topology, site: str, host: str, tls: bool) -> str:
    """The token to check; refuses a site this file reaches through an agent itself, a site with no
    token, and plain HTTP on an address other than loopback unless the site says insecure_http."""
    problems = []
    if site not in topo.sites:
        raise ConfigError([f"--site: site '{site}' is not defined under sites"])
    cfg = topo.sites[site]
    if cfg.agent:
        problems.append(
            f"sites.{site}.url is an agent url ({cfg.url}): the agent serves a site from its database, so this host's "
            "topology file gives the site's database url"
        )
    if not cfg.token:
        problems.append(f"sites.{site}.token: the agent checks a token; set one (token: ${{VAR}}) in the site's entry")
    elif len(cfg.token) < 16:
        problems.append(f"sites.{site}.token: a token of {len(cfg.token)} characters is too easy to guess; use 16 or more")
    if not tls and not is_loopback(host) and not cfg.insecure_http:
        problems.append(
            f"--listen {host}: plain HTTP on an address other than loopback sends the token and the changes in clear; "
            f"give --tls-cert and --tls-key, listen on 127.0.0.1, or write 'insecure_http: true' under sites.{site}"
        )
    if problems:
        raise ConfigError(problems)
    return str(cfg.token)


class _Handlers:
    """What each endpoint answers (plain data; a pull: an iterator of JSON lines), read at the site
    in a worker thread. `body` is the request's body, `q` its query parameters."""

    def __init__(self, topo: Topology, site: str):
        self.topo, self.name = topo, site
        self.s = Site(site, topo.sites[site].url, timeouts=topo.timeouts(site))

    def hello(self, q: Mapping[str, str], body: bytes) -> Any:
        return {"site": self.name, "dialect": self.s.dialect.name, "protocol": wire.PROTOCOL, "now_ms": int(time.time() * 1000)}

    def pull(self, q: Mapping[str, str], body: bytes) -> Any:
        b = json.loads(body)
        infos = [wire.info_of(x) for x in b["tables"]]
        self._check_layouts(infos)
        target = self._site({"target": str(b["target"])}, "target")
        window = b["window"]
        if not isinstance(window, int) or not 1 <= window <= MAX_WINDOW:
            raise ConfigError([f"a pull's window is 1 to {MAX_WINDOW:,} entries per table, not {window!r}"])
        wms = {i.name: int(b["watermarks"][i.name]) for i in infos}
        read = pull_link(self.s, target, infos, wms, window, self._have(b.get("have"), [i.name for i in infos]))
        return _lines(read, trim=b.get("trim") is True)

    def _have(self, raw: Any, tables: list[str]) -> dict[str, dict[str, str]] | None:
        """A pull's (or a waiting count's) `have` (table -> origin -> version the target applied),
        bound as SQL parameters (engine/pull.py read_entries): of the request's `tables`, strings of
        a version's size, or the request is refused."""
        if raw is None:
            return None
        if not isinstance(raw, dict) or not set(raw) <= set(tables):
            raise ConfigError(["a request's have names tables of the request, each with origin: version"])
        out: dict[str, dict[str, str]] = {}
        for t, h in raw.items():
            if not isinstance(h, dict) or not all(
                isinstance(o, str) and isinstance(v, str) and len(o) <= 64 and len(v) <= 255 for o, v in h.items()
            ):
                raise ConfigError([f"a request's have of {t!r} maps origins to versions"])
            out[t] = dict(h)
        return out

    def _check_layouts(self, infos: list[Any]) -> None:
        """The tables a client names are replicated tables of the topology, and every column name
        is a plain SQL name (they become SQL at the site)."""
        for i in infos:
            if i.name not in self.topo.tables:
                raise ConfigError([f"table '{i.name}' is not replicated by site '{self.name}'"])
            bad = [c for c in [i.key.name, *i.column_names, *(r.column for r in i.refs), *i.dropped] if not IDENT.match(c)]
            if bad:
                raise ConfigError([f"table '{i.name}': {bad} are not column names"])

    def purged(self, q: Mapping[str, str], body: bytes) -> Any:
        with self.s.read() as conn:
            return {"horizon": store.purges.horizon(conn, self.s.dialect, self._table(q))}

    def columns(self, q: Mapping[str, str], body: bytes) -> Any:
        with self.s.read() as conn:
            return {"columns": registered_columns(conn, self.s, self._table(q))}

    def status(self, q: Mapping[str, str], body: bytes) -> Any:
        return site_summary(self.s, self.topo, q.get("since"))

    def link(self, q: Mapping[str, str], body: bytes) -> Any:
        at = link_at_target(self.s, self._site(q, "peer"), self.topo)
        at["parked"] = [None if w is None else asdict(w) for w in at["parked"]]
        return at

    def waiting(self, q: Mapping[str, str], body: bytes) -> Any:
        b = json.loads(body)
        wms = {k: int(v) for k, v in b["watermarks"].items()}
        return link_at_source(self.s, str(b["target"]), self.topo, wms, self._have(b.get("have"), list(wms)))

    def held(self, q: Mapping[str, str], body: bytes) -> Any:
        source, d = self._site(q, "source"), self.s.dialect
        with self.s.read() as conn:
            if not self.s.installed_tables(conn):
                return {"installed": False}
            return {
                "installed": True,
                "last_success_at": store.links.row(conn, d, source).get("last_success_at"),
                "watermarks": {tb: store.watermarks.find(conn, d, source, tb) for tb in self.topo.tables},
            }

    def observe(self, q: Mapping[str, str], body: bytes) -> Any:
        with self.s.read() as conn:
            if not set(self.topo.tables) <= set(self.s.installed_tables(conn)):
                return None
            return {tb: asdict(store.fences.observe(conn, self.s.dialect, tb, self.name)) for tb in self.topo.tables}

    # ---- freshness (ops/freshness.py): `multimaster token` and `wait` ---------------------------

    def token(self, q: Mapping[str, str], body: bytes) -> Any:
        return {"token": token_at(self.s, self.topo)}

    def need(self, q: Mapping[str, str], body: bytes) -> Any:
        tok, of = check_token(q.get("token", ""))
        if of != self.name:
            raise ConfigError([f"the token is one of site '{of}'; this agent serves site '{self.name}'"])
        return need_at(self.s, self.topo, tok)

    def applied(self, q: Mapping[str, str], body: bytes) -> Any:
        applied, held = applied_at(self.s, self._site(q, "origin"))
        return {"applied": applied, "held": {tb: list(h) for tb, h in held.items()}}

    def missing(self, q: Mapping[str, str], body: bytes) -> Any:
        b = json.loads(body)
        applied, need = b.get("applied"), b.get("need")
        if not isinstance(applied, dict) or not isinstance(need, dict):
            raise ConfigError(["a missing request gives 'applied' and 'need', each per table"])
        for tb, v in [*applied.items(), *need.items()]:
            self._table({"table": tb})
            if v is not None and not isinstance(v, str):
                raise ConfigError([f"table '{tb}': {v!r} is not a version"])
        n, oldest = missing_at(self.s, applied, need)
        return {"missing": n, "oldest": oldest}

    # ---- listings: `multimaster errors` and `multimaster conflicts` (read-only) ---------------

    def errors(self, q: Mapping[str, str], body: bytes) -> Any:
        table = self._table(q) if q.get("table") else None
        return wire.data_out(errors_at(self.s, self.topo, table, q.get("skipped") == "1"))

    def conflicts(self, q: Mapping[str, str], body: bytes) -> Any:
        table = self._table(q) if q.get("table") else None
        kind = q.get("kind") or None
        if kind is not None and kind not in CONFLICT_KINDS:
            raise ConfigError([f"'{kind}' is not a conflict kind (one of {', '.join(CONFLICT_KINDS)})"])
        limit = q.get("limit", "100")
        if not limit.isdigit():
            raise ConfigError([f"a conflicts limit is a count (0: all), not '{limit}'"])
        return wire.data_out(conflicts_at(self.s, table, int(limit), q.get("since") or None, kind))

    # ---- what add-site reads at a site it copies or connects (ops/instantiate.py) ------------

    def installed(self, q: Mapping[str, str], body: bytes) -> Any:
        with self.s.read() as conn:
            return {"tables": self.s.installed_tables(conn)}

    def queue(self, q: Mapping[str, str], body: bytes) -> Any:
        with self.s.read() as conn:
            return store.errorqueue.counts(conn, self.s.dialect)

    def positions(self, q: Mapping[str, str], body: bytes) -> Any:
        with self.s.read() as conn:
            self.s.require_installed(conn, self.topo)
            return {tb: max_seq2(conn, self.s, tb) for tb in self.topo.tables}

    def describe(self, q: Mapping[str, str], body: bytes) -> Any:
        self.s.forget()  # as the database has it now
        with self.s.read() as conn:
            return {tb: wire.description_of(self.s.info(conn, tb, self.topo), self.s.dialect.name) for tb in self.topo.tables}

    def copy(self, q: Mapping[str, str], body: bytes) -> Any:
        b = json.loads(body)
        tables = [self._table({"table": str(x)}) for x in b["tables"]]
        target = str(b["target"])
        if not IDENT.match(target):
            raise ConfigError([f"'{target}' is not a site name"])
        relayed = tuple(self._site({"peer": str(x)}, "peer") for x in b["relayed"])
        size = b["batch_size"]
        if not isinstance(size, int) or not 1 <= size <= MAX_COPY_BATCH:
            raise ConfigError([f"a copy's batch is 1 to {MAX_COPY_BATCH:,} rows, not {size!r}"])
        self.s.forget()  # as the database has it now
        with self.s.read() as conn:
            self.s.require_installed(conn, self.topo)
            infos = {tb: self.s.info(conn, tb, self.topo) for tb in tables}
        pieces = read_copy(self.s, infos, CopyRequest(target, tuple(tables), relayed, bool(b["txn"]), size))
        first = next(pieces)  # the snapshot is taken here: a failure to take it is answered as an error
        return _copy_lines(first, pieces)

    def _table(self, q: Mapping[str, str]) -> str:
        tb = q.get("table", "")
        if tb not in self.topo.tables:
            raise ConfigError(
                [f"table '{tb}' is not replicated by site '{self.name}' (not under tables in the agent's topology)"]
            )
        return tb

    def _site(self, q: Mapping[str, str], name: str) -> str:
        p = q.get(name, "")
        if p not in self.topo.sites:
            raise ConfigError([f"site '{p}' is not defined under sites in the agent's topology"])
        return p


#: endpoint -> (handler, method)
ROUTES = {
    "hello": "GET",
    "pull": "POST",
    "purged": "GET",
    "columns": "GET",
    "status": "GET",
    "link": "GET",
    "waiting": "POST",
    "held": "GET",
    "observe": "GET",
    "token": "GET",
    "need": "GET",
    "applied": "GET",
    "missing": "POST",
    "errors": "GET",
    "conflicts": "GET",
    "installed": "GET",
    "queue": "GET",
    "positions": "GET",
    "describe": "GET",
    "copy": "POST",
}


def make_app(topo: Topology, site: str, token: str | None = None) -> Any:
    """The agent's Starlette application for `site` of `topo` (its database opened here)."""
    from starlette.applications import Starlette
    from starlette.routing import Route

    secret = (token if token is not None else _check_serving(topo, site, "127.0.0.1", True)).encode()
    h = _Handlers(topo, site)
    routes = [Route(f"/v1/{{site}}/{name}", _endpoint(getattr(h, name), site, secret), methods=[m]) for name, m in ROUTES.items()]

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        yield
        h.s.dispose()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.site = h.s
    return app


def _endpoint(fn: Callable[[Mapping[str, str], bytes], Any], site: str, secret: bytes) -> Callable[[Any], Any]:
    """An endpoint: checks the token (constant time) and the site, runs `fn` in a worker thread
    (it reads the database), answers its data as JSON (an iterator: streamed as JSON lines), and
    a multimaster error as JSON naming it (a request the agent refuses: 400)."""
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse, Response, StreamingResponse

    async def endpoint(request: Any) -> Any:
        auth = request.headers.get("authorization", "")
        given = auth[7:].encode() if auth[:7].lower() == "bearer " else b""
        if not hmac.compare_digest(given, secret):
            return JSONResponse({"error": "wrong or missing token"}, 401)
        if request.path_params["site"] != site:
            return JSONResponse({"error": f"this agent serves site '{site}', not '{request.path_params['site']}'"}, 404)
        body = await request.body()
        try:
            out = await run_in_threadpool(fn, dict(request.query_params), body)
        except ConfigError as e:  # the request names what the site does not have, or is malformed
            return JSONResponse({"error": redact("; ".join(e.problems))}, 400)
        except MultimasterError as e:
            return JSONResponse({"error": redact(str(e))}, 409)
        except Exception as e:  # noqa: BLE001 - the client records it as the link's error
            log.exception("agent request %s failed", request.url.path)
            reason = str(getattr(e, "orig", e)).strip().splitlines()
            return JSONResponse({"error": redact(f"{type(e).__name__} at site '{site}': {reason[0] if reason else ''}")}, 500)
        if isinstance(out, Iterator):
            return StreamingResponse(out, media_type="application/x-ndjson")
        return Response(json.dumps(out, default=str, separators=(",", ":")), 200, media_type="application/json")

    return endpoint


def _lines(read: Any, trim: bool = False) -> Iterator[bytes]:
    """A pull's answer as JSON lines: the head (horizon, window end, transactions continuing past
    it, whether more is to read, how far they reach), the rows of each table in pieces, the end with the row count
    (a client that misses the end applies nothing). `trim` (the client asked for it): each row
    without its trailing Nones (wire.row_out)."""
    yield (
        wire.dumps(
            {
                "kind": "head",
                "horizon": read.horizon,
                "end": read.end,
                "continuing": [wire.encode(tuple(g)) for g in read.continuing],
                "more": read.more,
                "beyond": read.beyond,
            }
        )
        + "\n"
    ).encode()
    count = 0
    for table, rows in read.rows.items():
        for i in range(0, len(rows), ROWS_PER_LINE):
            part = rows[i : i + ROWS_PER_LINE]
            count += len(part)
            yield (wire.dumps({"kind": "rows", "table": table, "rows": [wire.row_out(r, trim) for r in part]}) + "\n").encode()
    yield (wire.dumps({"kind": "end", "count": count}) + "\n").encode()


def _copy_lines(first: dict[str, Any], pieces: Generator[dict[str, Any], None, None]) -> Iterator[bytes]:
    """add-site's copy (ops/instantiate.py read_copy) as JSON lines, one per piece, then the end
    with the count of rows sent (a client that misses the end writes nothing). A read that fails
    midway ends with an error line instead; the read is closed either way."""
    count = 0
    try:
        for p in itertools.chain([first], pieces):
            if p["kind"] == "rows":
                count += len(p["rows"])
            yield (wire.dumps(wire.piece_out(p)) + "\n").encode()
    except MultimasterError as e:
        yield (wire.dumps({"kind": "error", "error": redact(str(e))}) + "\n").encode()
        return
    except Exception as e:  # noqa: BLE001 - named to the client, which writes nothing
        log.exception("add-site copy failed")
        reason = str(getattr(e, "orig", e)).strip().splitlines()
        yield (
            wire.dumps({"kind": "error", "error": redact(f"{type(e).__name__}: {reason[0] if reason else ''}")}) + "\n"
        ).encode()
        return
    finally:
        pieces.close()
    yield (wire.dumps({"kind": "end", "count": count}) + "\n").encode()


#: seconds the agent keeps an idle connection open (see make_server)
KEEPALIVE_SERVER = 75


def make_server(
    topo: Topology,
    site: str,
    listen: str,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    log_level: str = "warning",
) -> Any:
    """A uvicorn server of the agent (not started): checks the site's entry, the token and the
    listening address first (ConfigError naming each problem)."""
    import uvicorn

    host, port = parse_listen(listen)
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError(["--tls-cert and --tls-key go together"])
    for f in (tls_cert, tls_key):
        if f is not None and not os.path.isfile(f):
            raise ConfigError([f"TLS file {f} does not exist"])
    token = _check_serving(topo, site, host, tls_cert is not None)
    app = make_app(topo, site, token)
    with app.state.site.read() as conn:  # the database answers, before anyone is told the agent is up
        app.state.site.require_installed(conn, topo)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_certfile=tls_cert,
        ssl_keyfile=tls_key,
        log_level=log_level,
        access_log=log_level in ("debug", "info"),
        lifespan="on",
        timeout_graceful_shutdown=5,
        # longer than a client keeps an idle connection (remote.py KEEPALIVE) plus a request's way
        # there and back: with uvicorn's 5 s, on a link of a few seconds' delay the agent closed a
        # connection while the client's next request was on its way ('broke off its answer')
        timeout_keep_alive=KEEPALIVE_SERVER,
    )
    return uvicorn.Server(config)


def serve(
    topo: Topology, site: str, listen: str, tls_cert: str | None = None, tls_key: str | None = None, log_level: str = "warning"
) -> None:
    """Run the agent of `site` until interrupted (SIGINT / SIGTERM)."""
    make_server(topo, site, listen, tls_cert, tls_key, log_level).run()
