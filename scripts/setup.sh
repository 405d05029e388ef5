#!/usr/bin/env bash
# Create .venv (Python >= 3.11) and install multimaster with everything the tests need.
# Idempotent: a second run only checks. Usage: scripts/setup.sh [--spark]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.mm-installed
want="$(cat pyproject.toml | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[dev,spark]'
  echo "$want" > "$stamp"
fi
# JDBC drivers for the Spark convergence checks (Debian packages)
if [ -x scripts/install-jdbc.sh ] || [ -f scripts/install-jdbc.sh ]; then
  bash scripts/install-jdbc.sh
fi
