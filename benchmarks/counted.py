"""What benchmarks/bench_pg_instructions.py and bench_mysql_instructions.py share: the
application's workloads, instructions per transaction by difference, and the printed table."""

from __future__ import annotations

from typing import Callable

from bench_concurrency import N_BASE

#: the application's transactions, one statement each, the same SQL on both servers (each
#: benchmark adds the reconciler's, which set the echo guard the server's way)
APP_WORKLOADS: dict[str, Callable[[int], str]] = {
    "insert": lambda i: "BEGIN;\nINSERT INTO items (name, qty, price) VALUES ('x', 1, 0.5);\nCOMMIT;",
    "update": lambda i: f"BEGIN;\nUPDATE items SET qty = qty + 1 WHERE id = {i % N_BASE + 1};\nCOMMIT;",
}


def per_txn(count: Callable[[str], int], make: Callable[[int], str], n: int, per_row: int = 1) -> float:
    """Instructions per transaction (per row: `per_row` rows a transaction): `count` runs a script
    on a fresh copy of the database, once with n / 5 transactions and once with n more; start-up
    and the copy cancel out in the difference."""
    small = max(2, n // 5)
    few = count("\n".join(make(i) for i in range(small)) + "\n")
    many = count("\n".join(make(i) for i in range(small + n)) + "\n")
    return (many - few) / n / per_row


def print_table(
    names: list[str], workloads: list[str], txns: int, per_row: dict[str, int], measure: Callable[[int, str, int], float]
) -> None:
    """One line per workload: instructions per transaction of each database (`measure(index,
    workload, n)`, the first one plain), what multimaster adds and plain ÷ each other. Workloads
    of many rows a transaction count `txns` / 50 transactions."""
    print(
        f"{'workload':14} "
        + " ".join(f"{n:>14}" for n in names)
        + "   added by mm"
        + "".join(f"  plain ÷ {n}" for n in names[1:])
    )
    for w in workloads:
        n = txns if w not in per_row else max(2, txns // 50)
        got = [measure(i, w, n) for i in range(len(names))]
        added = " / ".join(f"{g - got[0]:,.0f}" for g in got[1:])
        ratios = "".join(f"  {got[0] / g:>{len('plain ÷ ' + n_)}.3f}" for g, n_ in zip(got[1:], names[1:]))
        print(f"{w:14} " + " ".join(f"{g:>14,.0f}" for g in got) + f"   {added}" + ratios, flush=True)
