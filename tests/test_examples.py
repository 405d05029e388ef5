"""Every script in examples/ runs to completion (each checks its own outcome and exits 0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).parent.parent / "examples"
EXPECT = {
    "airline_last_seat.py": "overbooked by 1",
    "inventory_additive.py": "sum of all 300 movements",
    "custom_resolver.py": "order independent",
    "offline_site.py": "back online: converged",
}


def test_every_example_is_tested():  # type: ignore[no-untyped-def]
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECT)


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_example_runs(name, tmp_path):  # type: ignore[no-untyped-def]
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / name), str(tmp_path / "sites")], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert EXPECT[name] in r.stdout
