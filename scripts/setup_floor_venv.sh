#!/usr/bin/env bash
# The floor environment: .venv's stack with transformers and peft at the lowest releases pyproject.toml declares
# (and what those releases pin: tokenizers, huggingface_hub), so the CPU rehearsal of the device check
# (tests/test_gpu_check.py) proves the declared range true at its bottom as well as at scripts/constraints.txt.
#
# .venv-floor/ in the clone (git-ignored) is a venv whose own site-packages hold only those packages and come first;
# a .pth file puts .venv's site-packages after them (torch, DeepSpeed, bitsandbytes, TRL and loraflow itself are
# .venv's). It builds in about 20 s, so it is not cached outside the clone; a change of either floor rebuilds it.
#   bash scripts/setup_floor_venv.sh            # build or refresh (needs .venv: scripts/setup_env.sh test)
#   bash scripts/setup_floor_venv.sh --where    # only print where its interpreter is
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-floor
if [ "${1:-}" = "--where" ]; then
  echo "$(pwd)/$venv/bin/python"
  exit 0
fi
[ -x .venv/bin/python ] || { echo "error: no .venv; run bash scripts/setup_env.sh test first" >&2; exit 2; }
read -r transformers peft < <(.venv/bin/python - <<'PY'
import tomllib, re
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
floor = {re.match(r"[\w.-]+", d).group(0): re.search(r">=\s*([\w.]+)", d).group(1) for d in deps if ">=" in d}
print(floor["transformers"], floor["peft"])
PY
)
python="${PYTHON:-python3}"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
base="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
own="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# addsitedir, not a plain path line: .venv's own .pth files (loraflow's editable install) must be read too.
echo "import site; site.addsitedir('$base')" > "$own/zz-loraflow-base.pth"
have() {  # have PACKAGE VERSION: PACKAGE==VERSION is this venv's own (not .venv's)
  [ -d "$own/$1-$2.dist-info" ]
}
if ! have transformers "$transformers" || ! have peft "$peft"; then
  # pip sees .venv's packages through the .pth and installs here only what the floors need that .venv lacks.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "transformers==$transformers" \
    "peft==$peft" 2>&1 | grep -v "dependency resolver\|which is incompatible\|^WARNING: Location" || true
fi
"$venv/bin/python" -c "import transformers, peft, tokenizers, huggingface_hub, torch; print('floor venv: transformers', \
transformers.__version__, 'peft', peft.__version__, 'tokenizers', tokenizers.__version__, 'huggingface_hub', \
huggingface_hub.__version__, 'torch', torch.__version__)"
echo "$(pwd)/$venv/bin/python"
