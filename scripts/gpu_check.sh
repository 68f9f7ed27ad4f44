#!/usr/bin/env bash
# Prove loraflow on the machine at hand in one command: versions and matmul rates, gradient equivalence against the
# fp32 reference on the device (LoRA, DoRA, every checkpoint mode, fp32 and bf16-mixed, QLoRA on bitsandbytes'
# kernels, ZeRO-3 and FSDP2 at world size 1), the demo, the QLoRA example, one image-text step, and loraflow against
# a plain PyTorch loop and TRL on Llama-3.2-1B's shape in bf16. Each step is bounded in time; the summary table
# comes last (DIR/summary.md). About 8 minutes on an H100.
#   bash scripts/gpu_check.sh [--out DIR] [--device cuda|cpu] [--quick] [--budget SECONDS] [--only STEP,...]
#   bash scripts/gpu_check.sh --device cpu --quick --out /tmp/check    # the CPU rehearsal (tests/test_gpu_check.py)
# Offline: the wheels in .whl/ (scripts/gpu_wheels.sh) that this machine lacks are installed with --no-index
# --no-deps into a temporary directory, then loraflow itself without its dependencies; nothing is downloaded.
# The Python is $PYTHON, else .venv/bin/python when there is one, else python3. Exit 0: every step passed.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
out="runs/gpu-check-$(date +%Y%m%d-%H%M%S)"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
python="${PYTHON:-}"
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
site="$(mktemp -d "${TMPDIR:-/tmp}/loraflow-gpu-check-site.XXXXXX")"
trap 'rm -rf "$site"' EXIT
mkdir -p "$out"
out="$(cd "$out" && pwd)"
if ! {
  echo "python: $python ($("$python" -c 'import sys; print(sys.version.split()[0])'))"
  if compgen -G ".whl/*.whl" > /dev/null; then
    echo "installing from .whl/ what this machine lacks:"
    "$python" scripts/gpu_bundle.py install --dest .whl --target "$site"
  fi
  # loraflow itself, without its dependencies and without build isolation (which would fetch setuptools), built
  # from a copy: setuptools builds in the source tree's build/, which two checks at once would share.
  mkdir "$site/.source"
  cp -r pyproject.toml README.md src "$site/.source/"
  "$python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-build-isolation \
    --no-compile --target "$site" "$site/.source"
} 2>&1 | tee "$out/install.log"; then
  echo "error: installing failed; see $out/install.log" >&2
  exit 2
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m loraflow.verify.devicecheck --out "$out" --root "$root" "${args[@]}"
