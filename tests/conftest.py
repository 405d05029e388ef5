"""Shared fixtures. `backend` runs a test over every database (sqlite always; server databases
when they answer, and always under CI where MM_REQUIRE_SERVERS=1 turns a missing server into a
failure instead of a skip)."""

from __future__ import annotations

import os

import pytest

from clusters import BACKENDS, Backend

REQUIRE_SERVERS = os.environ.get("MM_REQUIRE_SERVERS") == "1"


def server_unavailable(name: str, reason: str) -> None:
    msg = f"{name} server not reachable ({reason}); set MM_{name.upper()}_URL or start it"
    if REQUIRE_SERVERS:
        pytest.fail(msg + " — MM_REQUIRE_SERVERS=1 makes this a failure", pytrace=False)
    pytest.skip(msg)


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
