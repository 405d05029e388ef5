#!/usr/bin/env bash
# The whole test suite (SQLite always; PostgreSQL and MariaDB when they answer; Spark).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# lint, format and types first: CI enforces them through this same command (scripts/check.sh alone
# runs just these)
bash scripts/check.sh
# two workers (the machine's cores; MM_TEST_WORKERS overrides, 0 runs in this process): most tests
# wait on a database server, and every Spark test goes to one worker (tests/conftest.py); the 25
# slowest tests are listed at the end (the suite is kept under 15 minutes)
exec .venv/bin/python -m pytest -q -n "${MM_TEST_WORKERS:-2}" --dist loadgroup --durations=25 "$@"
