#!/usr/bin/env bash
# Static checks, as the test command runs them: ruff (lint, then format --check) and mypy.
# `bash scripts/check.sh --fix` rewrites what ruff can fix and formats the tree instead of checking.
set -euo pipefail
cd "$(dirname "$0")/.."
PATHS=(multimaster tests benchmarks examples)
if [ "${1:-}" = "--fix" ]; then
  .venv/bin/ruff check --fix "${PATHS[@]}"
  .venv/bin/ruff format "${PATHS[@]}"
else
  .venv/bin/ruff check "${PATHS[@]}"
  .venv/bin/ruff format --check "${PATHS[@]}"
fi
.venv/bin/mypy multimaster
