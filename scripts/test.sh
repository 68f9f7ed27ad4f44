#!/usr/bin/env bash
# Install loraflow with its test tools into .venv, build (or reuse from the cache) the DeepSpeed 0.15.3 environment
# of the legacy tests, the floor environment (the oldest transformers and peft pyproject.toml declares, for the
# device check's CPU rehearsal) and vLLM's (the RL rollout engine's tests), and run the whole test suite (extra
# arguments go to pytest).
#   bash scripts/test.sh                      # everything
#   bash scripts/test.sh -m "not distributed" # the one-process tests only (tests/distributed/ launches 2 ranks)
set -euo pipefail
cd "$(dirname "$0")/.."
# The environments build before pytest (a cold build takes minutes, and a test must never build one inside its
# timeout), side by side where they can: vLLM's (the RL rollout engine's tests) needs nothing from this clone, so it
# builds in the background from the start; the DeepSpeed 0.15.3 one of the legacy tests installs this clone
# editable, as .venv does, so it starts only once .venv's install has left the clone (two editable builds of one
# tree at once race on its build files); the floor environment (the oldest transformers and peft pyproject.toml
# declares) sits on .venv's stack. Mostly downloads and unpacking: about 2 minutes cold instead of 4.
logs="$(mktemp -d)"
bash scripts/setup_vllm.sh >"$logs/vllm" 2>&1 &
vllm=$!
bash scripts/setup_env.sh test
bash scripts/setup_legacy_venv.sh >"$logs/legacy" 2>&1 &
legacy=$!
bash scripts/setup_floor_venv.sh
for job in legacy vllm; do
  if ! wait "${!job}"; then
    echo "error: building the $job environment failed (scripts/setup_${job/legacy/legacy_venv}.sh):" >&2
    tail -40 "$logs/$job" >&2
    exit 1
  fi
  tail -1 "$logs/$job"
done
LORAFLOW_LEGACY_PYTHON="$(bash scripts/setup_legacy_venv.sh --where)"
LORAFLOW_FLOOR_PYTHON="$(bash scripts/setup_floor_venv.sh --where)"
LORAFLOW_VLLM_PYTHON="$(bash scripts/setup_vllm.sh --where)"
export LORAFLOW_LEGACY_PYTHON LORAFLOW_FLOOR_PYTHON LORAFLOW_VLLM_PYTHON
exec .venv/bin/python -m pytest -q "$@"
