#!/usr/bin/env bash
# Create .venv (once) and install loraflow into it with the pinned versions. Safe to run again.
#   bash scripts/setup_env.sh          # loraflow
#   bash scripts/setup_env.sh test     # loraflow + test tools
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
# torch first, exactly: a looser spec would fetch a multi-GB CUDA build instead of the local CPU wheel.
"${pip[@]}" "torch==2.13.0"
target="."
[ -n "$extras" ] && target=".[$extras]"
"${pip[@]}" -c scripts/constraints.txt -e "$target"
