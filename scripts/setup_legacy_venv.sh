#!/usr/bin/env bash
# Create .venv-ds0153 (once): the current stack with DeepSpeed 0.15.3 instead of 0.19.x, for the probes and
# explain fixtures of bugs fixed upstream after 0.15.3 (zero3-frozen-recompute, zero3-eval-backward).
# Safe to run again: it only installs what is missing.
#   bash scripts/setup_legacy_venv.sh
#   .venv-ds0153/bin/python -m loraflow.cli probe ...   (or scripts/capture_failure_logs.py uses it)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-ds0153
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
want() {  # want PACKAGE VERSION: true when PACKAGE==VERSION is already installed in the venv
  "$venv/bin/python" - "$1" "$2" <<'EOF' 2>/dev/null
import importlib.metadata, sys
sys.exit(0 if importlib.metadata.version(sys.argv[1]).split("+")[0] == sys.argv[2] else 1)
EOF
}
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch first, exactly: a looser spec would fetch a multi-GB CUDA build instead of the local CPU wheel.
want torch 2.13.0 || "${pip[@]}" "torch==2.13.0"
# DeepSpeed ships only an sdist whose setup.py imports torch (through its accelerator) and has no pyproject.toml:
# build it against the venv's torch without build isolation, for the CPU accelerator (it prebuilds no op; the
# ones it needs compile at first use with g++). Its requirements (hjson, msgpack, ninja, numpy, psutil,
# py-cpuinfo, pydantic>=2) resolve with today's releases; no older pin is needed.
if ! want deepspeed 0.15.3; then
  "${pip[@]}" setuptools wheel
  DS_ACCELERATOR=cpu DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation "torch==2.13.0" "deepspeed==0.15.3"
fi
"${pip[@]}" -c scripts/constraints.txt -e .
"$venv/bin/python" -c "import deepspeed, torch, transformers, peft; print('.venv-ds0153:', 'torch', torch.__version__, \
'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
