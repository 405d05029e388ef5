#!/usr/bin/env bash
# The whole test suite (SQLite always; PostgreSQL and MariaDB when they answer; Spark).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# lint, format and types first: CI enforces them through this same command (scripts/check.sh alone
# runs just these)
bash scripts/check.sh
exec .venv/bin/python -m pytest -q "$@"
