#!/usr/bin/env bash
# The legacy environment: the current stack with DeepSpeed 0.15.3 instead of 0.19.x, for the probes and explain
# fixtures of bugs fixed upstream after 0.15.3 (zero3-frozen-recompute, zero3-eval-backward).
#
# It lives in a cache outside the clone, ${LORAFLOW_CACHE:-$HOME/.cache/loraflow}/venv-ds0153-KEY, where KEY hashes
# this script, scripts/constraints.txt and the base Python: building it (torch, then DeepSpeed's sdist) takes
# minutes, so CI keeps it between runs, and any change to what goes into it builds a new one. loraflow itself is
# installed editable from this clone every time (seconds). .venv-ds0153 in the clone links to it, for the scripts
# and commands that name that path.
#   bash scripts/setup_legacy_venv.sh            # build or refresh; prints the interpreter's path last
#   bash scripts/setup_legacy_venv.sh --where    # only print where the interpreter is (or would be)
#   .venv-ds0153/bin/python -m loraflow.commands.cli probe ...   (or scripts/capture_failure_logs.py uses it)
# scripts/test.sh runs it before pytest and exports LORAFLOW_LEGACY_PYTHON; tests/distributed/test_legacy_deepspeed.py
# only locates the interpreter (that variable, else `--where`).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
TORCH=2.13.0
DEEPSPEED=0.15.3
cache="${LORAFLOW_CACHE:-$HOME/.cache/loraflow}"
key=$( { cat scripts/setup_legacy_venv.sh scripts/constraints.txt; "$python" -c 'import sys; print(sys.version)'; } \
       | sha256sum | cut -c1-12)
venv="$cache/venv-ds0153-$key"
if [ "${1:-}" = "--where" ]; then
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p "$cache"
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
want torch "$TORCH" || "${pip[@]}" "torch==$TORCH"
# DeepSpeed ships only an sdist whose setup.py imports torch (through its accelerator) and has no pyproject.toml:
# build it against the venv's torch without build isolation, for the CPU accelerator (it prebuilds no op; the
# ones it needs compile at first use with g++). Its requirements (hjson, msgpack, ninja, numpy, psutil,
# py-cpuinfo, pydantic>=2) resolve with today's releases; no older pin is needed.
if ! want deepspeed "$DEEPSPEED"; then
  "${pip[@]}" setuptools wheel
  DS_ACCELERATOR=cpu DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation "torch==$TORCH" "deepspeed==$DEEPSPEED"
fi
# Editable from this clone (a cached venv may last have pointed at another clone). The constraints pin
# deepspeed 0.19.x, which must not replace 0.15.3: drop that line, keep the rest.
grep -v '^deepspeed==' scripts/constraints.txt > "$venv/constraints-legacy.txt"
"${pip[@]}" -c "$venv/constraints-legacy.txt" -e .
"$venv/bin/python" -c "import deepspeed, torch, transformers, peft; print('legacy venv:', 'torch', torch.__version__, \
'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
# Drop the builds for earlier keys: each is 1.5 GB and nothing reads them once the key has moved on.
for old in "$cache"/venv-ds0153-*; do
  [ "$old" != "$venv" ] && [ -d "$old" ] && rm -rf "$old"
done
# .venv-ds0153 in the clone: a link to the cached venv. A real directory there (built by an earlier version of
# this script) is left alone; remove it to switch to the link.
if [ -L .venv-ds0153 ] || [ ! -e .venv-ds0153 ]; then
  ln -sfn "$venv" .venv-ds0153
else
  echo "note: .venv-ds0153 is a directory from an earlier setup; the tests use $venv" >&2
fi
echo "$venv/bin/python"
