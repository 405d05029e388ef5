"""Shared pytest setup. `backend` runs a test over every database (sqlite always; server databases
when they answer, and always under CI where MM_REQUIRE_SERVERS=1 turns a missing server into a
failure instead of a skip)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from clusters import BACKENDS, DROPPER, SPARES, Backend, made, opened, server_unavailable
from hypothesis import HealthCheck, settings

# The suite shares 2 noisy cores with the servers and other runs: how fast hypothesis generates
# inputs is not what a property test checks (a stalled first draw of 2 s failed a CI-like run).
# Tests with their own @settings inherit this.
settings.register_profile("multimaster", suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("multimaster")


@pytest.fixture(autouse=True)
def _loggers_as_they_were() -> Iterator[None]:
    """The `multimaster` and `apscheduler` loggers as each test found them: `multimaster run`,
    run in this process (tests/clusters.py mm), sets them up as a daemon's (its own handler, not
    propagating), and a later test of the same worker reading the log with caplog saw nothing
    (a wait for the purge job's lines ran out in CI)."""
    saved = {n: (lg.handlers[:], lg.level, lg.propagate) for n in ("multimaster", "apscheduler") for lg in [logging.getLogger(n)]}
    yield
    for n, (handlers, level, propagate) in saved.items():
        lg = logging.getLogger(n)
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate


@pytest.fixture(params=list(BACKENDS), ids=list(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Backend:
    factory = BACKENDS[request.param]
    try:
        b = factory()
    except ConnectionError as e:
        server_unavailable(request.param, str(e))
    yield b
    b.cleanup()


@pytest.fixture
def sqlite_backend() -> Backend:
    return BACKENDS["sqlite"]()


@pytest.fixture
def mysql_backend() -> Iterator[Backend]:
    """MariaDB alone (a test of what only MariaDB has)."""
    yield from opened("mysql")


@pytest.fixture
def pg_backend() -> Iterator[Backend]:
    """PostgreSQL alone."""
    yield from opened("postgresql")


@pytest.fixture
def mixed() -> Iterator[dict[str, Backend]]:
    """One backend of each database ("sqlite", "postgresql", "mysql"), for a mixed cluster; their
    databases dropped after the test."""
    backends = {n: made(n) for n in ("sqlite", "postgresql", "mysql")}
    yield backends
    for b in backends.values():
        b.cleanup()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`scripts/test.sh` runs `-n 2 --dist loadgroup`), every Spark test runs on
    the same worker, so one JVM serves them all (tests/spark/conftest.py's session). xdist's worker
    reads the marker in its own pytest_collection_modifyitems (it renames the item
    `<nodeid>@spark`), hence first. pytest is kept below 9 (pyproject.toml): pytest 9 derives a
    node's id from a field xdist 3.8 does not rename, the group was lost and each worker started
    its own JVM."""
    for item in items:
        if item.path.parent.name == "spark":
            item.add_marker(pytest.mark.xdist_group("spark"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The tests' server databases are dropped in the background (clusters.py DROPPER), and
    PostgreSQL's are created ahead (SPARES): drop the spares left, wait for the last drop before the
    process ends, and say which could not be dropped."""
    SPARES.drain()
    failed = DROPPER.drain()
    if failed:
        print(f"\n{len(failed)} test database(s) not dropped: " + "; ".join(failed[:5]))


@pytest.fixture
def servers() -> Iterator[dict[str, Backend]]:
    """A PostgreSQL and a MariaDB backend (a missing server skips, or fails under
    MM_REQUIRE_SERVERS), their databases dropped after the test (test_collations, test_unique_retry)."""
    backends = {n: made(n) for n in ("postgresql", "mysql")}
    yield backends
    for b in backends.values():
        b.cleanup()
