"""Shared pytest setup. `backend` runs a test over every database (sqlite always; server databases
when they answer, and always under CI where MM_REQUIRE_SERVERS=1 turns a missing server into a
failure instead of a skip)."""

from __future__ import annotations

import pytest
from clusters import BACKENDS, Backend, server_unavailable


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
