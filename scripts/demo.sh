#!/usr/bin/env bash
# The main job: three SQLite sites, writes everywhere, refresh until they converge.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/multimaster demo --dir "${MM_DEMO_DIR:-demo-sites}" "$@"
