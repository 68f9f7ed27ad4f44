#!/usr/bin/env bash
# Install loraflow with its test tools into .venv and run the whole test suite (extra arguments go to pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
exec .venv/bin/python -m pytest -q "$@"
