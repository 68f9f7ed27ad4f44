#!/usr/bin/env bash
# Fetch what a GPU machine without network access lacks for scripts/gpu_check.sh into .whl/ (git-ignored), and
# print the total that travels to it (working tree + .whl/), which must stay under 60 MiB.
#   bash scripts/gpu_wheels.sh                                   # the lent machines: Python 3.12, CUDA 13
#   bash scripts/gpu_wheels.sh --python-version 3.11 --bnb-cuda all    # another machine
# The versions are the ones installed in .venv (scripts/constraints.txt); scripts/gpu_bundle.py says what is
# carried and why. Then, on the GPU machine: bash scripts/gpu_check.sh (it installs from .whl/ offline).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test  # .venv holds the tested versions, and the torch DeepSpeed's wheel builds against
.venv/bin/python scripts/gpu_bundle.py download --dest .whl "$@"
ls -l .whl
.venv/bin/python scripts/gpu_bundle.py size --dest .whl
