"""The wheels a GPU machine without network access needs for scripts/gpu_check.sh: fetched here, installed there.

    python scripts/gpu_bundle.py download [--dest .whl] [--python-version 3.12] [--bnb-cuda 130,132]
    python scripts/gpu_bundle.py size [--dest .whl] [--limit-mib 60]     # what travels: working tree + .whl/
    python scripts/gpu_bundle.py install --dest .whl --target DIR        # on the GPU machine, offline

`download` runs on this machine (scripts/gpu_wheels.sh calls it with .venv's Python): each package of CARRY at the
version installed in .venv (the tested one, scripts/constraints.txt), as a wheel for the target Python on
manylinux x86_64. DeepSpeed publishes only an sdist, so its wheel is built here (pure Python: its CUDA ops compile
at first use). bitsandbytes' wheel holds its kernels for every CUDA and ROCm release (129 MB unpacked, 43 MB
packed); it is repacked with the CPU library and the CUDA releases asked for only (--bnb-cuda; `all` keeps every
one), which bitsandbytes picks by torch.version.cuda (13.0 -> libbitsandbytes_cuda130.so).

`install` runs on the GPU machine with its own Python: a carried package is installed only where that machine lacks
it, or has an older release than carried (a dependency loraflow declares: older than its floor), with pip
--no-index --no-deps into a target directory that goes on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CARRY = {
    "bitsandbytes": "QLoRA's 4-bit layers and their CUDA kernels",
    "deepspeed": "the ZeRO-3 cells",
    "pydantic": "DeepSpeed's config", "pydantic-core": "pydantic", "annotated-types": "pydantic",
    "typing-inspection": "pydantic", "typing-extensions": "pydantic needs >= 4.16", "hjson": "DeepSpeed",
    "trl": "the TRL variant of benchmarks/peers.py", "datasets": "TRL", "dill": "datasets",
    "multiprocess": "datasets",
    "peft": "only where the machine's peft is older than loraflow's floor",
}
"""What the lent GPU machines lack (their image holds torch, transformers, peft, accelerate, numpy, pandas,
pyarrow, msgpack, psutil, ninja, einops, xxhash, fsspec and the rest loraflow needs; no deepspeed, bitsandbytes,
trl, datasets or pydantic), with who needs it."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
BUILT_HERE = ("deepspeed",)
"""Published as an sdist only: built into a wheel here."""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def download(dest: Path, python_version: str, bnb_cuda: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in CARRY if name not in BUILT_HERE]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([*pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version",
                    python_version, "--implementation", "cp", *platforms, "-d", str(dest), *pins], check=True)
    for name in BUILT_HERE:  # DS_BUILD_OPS=0: no op compiled here; the CPU accelerator needs no CUDA to build
        env = {**os.environ, "DS_BUILD_OPS": "0", "DS_ACCELERATOR": "cpu"}
        subprocess.run([*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dest),
                        f"{name}=={importlib.metadata.version(name)}"], check=True, env=env)
    dropped = []
    if bnb_cuda != "all":
        for wheel in dest.glob("bitsandbytes-*.whl"):
            dropped = slim_bitsandbytes(wheel, {c.strip() for c in bnb_cuda.split(",") if c.strip()})
    (dest / "BUNDLE.json").write_text(json.dumps({"python_version": python_version, "bnb_cuda": bnb_cuda,
                                                  "bitsandbytes_dropped": dropped,
                                                  "wheels": sorted(w.name for w in dest.glob("*.whl"))}, indent=2))


def slim_bitsandbytes(wheel: Path, keep_cuda: set[str]) -> list[str]:
    """Rewrite the wheel without the GPU libraries of other CUDA releases and of ROCm/XPU; RECORD is rewritten to
    match. Returns the names dropped."""
    pattern = re.compile(r"libbitsandbytes_(cuda\d+|rocm\d+|xpu\d*)\w*\.(so|dll|dylib)$")
    dropped = []
    with tempfile.NamedTemporaryFile(dir=wheel.parent, suffix=".whl", delete=False) as tmp:
        with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as out:
            for info in src.infolist():
                match = pattern.search(info.filename)
                if match and match.group(1).removeprefix("cuda") not in keep_cuda:
                    dropped.append(info.filename)
                    continue
                data = src.read(info.filename)
                if info.filename.endswith(".dist-info/RECORD"):
                    lines = data.decode().splitlines()
                    data = ("\n".join(line for line in lines if line.split(",")[0] not in dropped) + "\n").encode()
                out.writestr(info, data)
    os.chmod(tmp.name, 0o644)  # NamedTemporaryFile makes it private; the wheel it replaces was not
    os.replace(tmp.name, wheel)
    return dropped


def travel_size(dest: Path) -> tuple[int, int, int]:
    """(bytes of the working tree that travels, files in it, bytes of dest): tracked files and untracked files git
    does not ignore, as the device tool copies them."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    files = [ROOT / os.fsdecode(p) for p in listed if p]
    tree = sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())
    bundle = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file()) if dest.exists() else 0
    return tree, len(files), bundle


def needed(name: str, carried: str, have: str | None, floors: dict) -> str | None:
    """Why a carried wheel must be installed on a machine that has `have` (None: not installed), or None to keep
    the machine's own: a dependency loraflow declares only below its floor, anything else below the carried
    release."""
    from packaging.version import Version

    if have is None:
        return "missing"
    want = floors.get(name, Version(carried))
    have_version = Version(have.split("+")[0])
    return f"{have_version} < {want}" if have_version < want else None


def install(dest: Path, target: Path) -> int:
    """On the GPU machine: pip-install the carried wheels this machine needs into `target` (offline)."""
    sys.path.insert(0, str(ROOT / "src"))
    from loraflow.environment import declared_floors

    floors = declared_floors()
    chosen = []
    for wheel in sorted(dest.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        name = _norm(name)
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = None
        reason = needed(name, version, have, floors)
        print(f"  {name} {version}: " + (f"install ({reason})" if reason else f"keep the machine's {have}"))
        if reason:
            chosen.append(str(wheel))
    if not chosen:
        return 0
    target.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                           "--no-index", "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade", "--target",
                           str(target), *chosen], check=False).returncode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("download", "size", "install"))
    p.add_argument("--dest", type=Path, default=ROOT / ".whl")
    p.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    p.add_argument("--bnb-cuda", default="130,132", help="CUDA releases whose bitsandbytes kernels to keep "
                   "(default 130,132: the lent machines run CUDA 13.0), or all")
    p.add_argument("--limit-mib", type=float, default=60.0)
    p.add_argument("--target", type=Path, help="install: the directory to install into (put on PYTHONPATH)")
    args = p.parse_args()
    if args.action == "download":
        download(args.dest, args.python_version, args.bnb_cuda)
        return 0
    if args.action == "install":
        if args.target is None:
            p.error("install needs --target DIR")
        return install(args.dest, args.target)
    tree, count, bundle = travel_size(args.dest)
    total = (tree + bundle) / 2**20
    print(f"travels: working tree {tree / 2**20:.1f} MiB ({count} files) + {args.dest.name}/ {bundle / 2**20:.1f} "
          f"MiB = {total:.1f} MiB (limit {args.limit_mib:g} MiB)")
    if total > args.limit_mib:
        print(f"error: {total:.1f} MiB is over {args.limit_mib:g} MiB; keep fewer bitsandbytes kernels (--bnb-cuda) "
              "or remove untracked files from the working tree", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
