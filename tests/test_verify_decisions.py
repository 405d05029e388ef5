"""verify's decisions as plain data (no Spark): a table's status from its differing rows and those
no waiting change explains, a run's status from its tables', and the sentence naming the first
unexplained row. The Spark side that counts the rows is tested in tests/spark/."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multimaster.spark.report import verdict
from multimaster.spark.result import Sample, TableResult, VerifyResult, run_status, table_status

counts = st.integers(min_value=0, max_value=10**9)


@given(counts, counts)
def test_a_table_is_diverged_as_soon_as_one_difference_is_unexplained(a, b):  # type: ignore[no-untyped-def]
    differing, unexplained = max(a, b), min(a, b)
    status = table_status(differing, unexplained)
    assert (status == "converged") == (differing == 0)
    assert (status == "diverged") == (unexplained > 0)
    assert (status == "converging") == (differing > 0 and unexplained == 0)


@pytest.mark.parametrize("differing, unexplained", [(1, 2), (-1, 0), (3, -1)])
def test_impossible_counts_are_refused(differing, unexplained):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        table_status(differing, unexplained)


def table(name: str, differing: int, unexplained: int, samples: list[Sample] | None = None) -> TableResult:
    return TableResult(
        table=name,
        status=table_status(differing, unexplained),
        rows={"s1": 10, "s2": 10},
        fingerprints={"s1": "0", "s2": "0"},
        identities=10,
        differing=differing,
        counts={k: {"s1": 0, "s2": 0} for k in ("missing", "extra", "key", "values")},
        columns={},
        samples=samples or [],
        waiting=[],
        unexplained=unexplained,
    )


@given(st.lists(st.tuples(counts, counts), min_size=1, max_size=6))
def test_a_run_is_as_bad_as_its_worst_table_and_round_trips(pairs):  # type: ignore[no-untyped-def]
    tables = {f"t{i}": table(f"t{i}", max(a, b), min(a, b)) for i, (a, b) in enumerate(pairs)}
    res = VerifyResult(["s1", "s2"], tables, "local[1]", "full", "2026-01-01T00:00:00+00:00", 1.0)
    statuses = [t.status for t in tables.values()]
    assert res.status == run_status(statuses)
    assert (res.status == "diverged") == any(t.unexplained for t in tables.values())
    assert (res.status == "converged") == all(t.differing == 0 for t in tables.values())
    assert res.exit_code == (0 if res.status == "converged" else 1)
    d = json.loads(json.dumps(res.to_dict()))
    assert VerifyResult.from_dict(d).to_dict() == d


def test_a_result_recorded_before_per_row_decisions_still_loads():  # type: ignore[no-untyped-def]
    res = VerifyResult(["s1", "s2"], {"t": table("t", 2, 0)}, "local[1]", "full", "2026-01-01T00:00:00+00:00", 1.0)
    d = res.to_dict()
    del d["tables"]["t"]["unexplained"]
    back = VerifyResult.from_dict(d)
    assert back.tables["t"].unexplained == 0 and back.status == "converging"


def test_the_verdict_names_the_first_row_nothing_explains():  # type: ignore[no-untyped-def]
    present = {"state": "present", "key": 20, "values": {"qty": 999}}
    samples = [
        Sample("values", "0000000000000000000:#20", {"s1": present, "s2": {**present, "values": {"qty": 20}}}, ["s2"], ["qty"]),
        Sample("values", "0000000000000000000:#3", {"s1": present, "s2": present}, ["s1"], ["qty"], waiting=True),
    ]
    text = verdict("items", table("items", 2, 1, samples))
    assert "1 of the 2 differing row(s) have no change on its way" in text and "diverged" in text
    assert "identity 0000000000000000000:#20, key 20, same row, different values" in text
    assert "converging" not in verdict("items", table("items", 2, 0)) and "on its way" in verdict("items", table("items", 2, 0))
    with pytest.raises(ValueError):
        run_status(["converged", "unknown"])
