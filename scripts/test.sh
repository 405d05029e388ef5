#!/usr/bin/env bash
# The whole test suite (SQLite always; PostgreSQL and MariaDB when they answer; Spark).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
