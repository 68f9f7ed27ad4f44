#!/usr/bin/env bash
# Install loraflow into .venv and fine-tune the built-in demo (extra arguments go to `loraflow train sft`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/loraflow train sft "$@"
