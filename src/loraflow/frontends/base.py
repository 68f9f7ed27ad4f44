"""What every frontend module shares with the package: the result type, the framework declaration, the command view
recognisers read, and the table of frameworks (in dispatch order) with look-ups by name. Frontend modules import
these from here, never from the package `loraflow.frontends`, whose __init__ imports the frontends (no import cycle);
the package re-exports the public names for callers outside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from difflib import get_close_matches
from importlib import import_module
from typing import Callable

from loraflow.rules.combination import Combination


@dataclass
class FrontendResult:
    framework: str
    setup: Combination
    sources: dict[str, str] = field(default_factory=dict)
    """Combination field -> where its value came from: `--zero_stage 3`, `ds.json: zero_optimization.stage`,
    or `default (openrlhf/cli/train_sft.py)`."""
    unknown: list[str] = field(default_factory=list)
    """Flags or keys this frontend did not understand; printed, never silently ignored."""
    notes: list[str] = field(default_factory=list)
    flags: dict[str, str] = field(default_factory=dict)
    """Combination field -> this framework's flag or key that changes it (used to word fixes)."""
    queried: dict = field(default_factory=dict)
    """Package -> the versions the frontend compared it with (where its defaults change)."""
    eras: dict = field(default_factory=dict)
    """Package -> (specifier, reason): the release range the command itself reveals."""
    unsure: dict = field(default_factory=dict)
    """Combination field -> ({value: meaning}, why): choices made in the user's code, where no flag shows them."""
    forks: dict = field(default_factory=dict)
    """Name -> ({value: meaning}, why): what a file that is not here decides and the rest is read from (the engine
    an unseen accelerate config selects); `check` builds the setup once per value (Draft.fork)."""
    stops: list = field(default_factory=list)
    """What makes the framework refuse this launch at start-up (Draft.stop), each with the check that refuses it and
    the fix: the launch fails as given, before any rule's failure could happen."""


@dataclass(frozen=True)
class Mitigation:
    """Rules a framework's own code works around from one of its releases on: before `since` they hold for its runs
    as for any other, from `since` on its code closes them (within what `how` says). Frontends decide with
    common.mitigated(draft, rule); docs/mitigations.md lists them."""
    rules: tuple[str, ...]
    since: str
    how: str
    source: str
    """Where the framework's code does it (file, function, PR)."""
    package: str = ""
    """The package whose release counts, when it is not the framework itself (Unsloth, read by the script reader)."""


@dataclass(frozen=True)
class Framework:
    """What a frontend module declares about its framework, once (its module-level FRAMEWORK)."""
    name: str
    title: str
    module: str
    recognise: Callable[[CommandView], bool] | None
    """Whether a launch command line runs this framework; None: it has no command line (a config format)."""
    flags: dict[str, str]
    """Combination field -> the framework's flag or key that changes it, in its usual spelling (words every fix)."""
    log_paths: str = ""
    """Where a traceback runs through this framework's own code (`loraflow explain` names the framework)."""
    file_markers: frozenset[str] = frozenset()
    """Config-file keys only this framework uses (to recognise its YAML on a launch line or given to check)."""
    depends: tuple[tuple[str, str, dict[str, str]], ...] = ()
    """(package, release range, {dependency: range}): what a release range pins (requirements.txt), so the
    scenarios of `check` never pair a release with versions it cannot run with."""
    aliases: tuple[str, ...] = ()
    """Other spellings of its name (`swift`, `llama_factory`), accepted wherever the name is."""
    dated: bool = False
    """Its own release changes its defaults: `--versions NAME=X` names it, and `check` evaluates its releases."""
    mitigations: tuple[Mitigation, ...] = ()
    """The rules its own code works around, by release."""


# The frontends in dispatch order: the first whose `recognise` accepts a command line reads it; the general HF
# Trainer reader comes last among those with command lines. This tuple is the one list of frameworks.
_MODULES = ("openrlhf", "verl", "nemo_rl", "torchtune", "axolotl", "llama_factory", "ms_swift", "deepspeed_chat",
            "alpaca_lora", "litgpt", "llava", "llama_recipes", "vllm_serve", "hf", "python_script", "deepspeed",
            "accelerate")


def frameworks() -> list[Framework]:
    return [import_module(f"loraflow.frontends.{m}").FRAMEWORK for m in _MODULES]


def framework(name: str) -> Framework:
    from loraflow.errors import LoraflowError

    known = {f.name: f for f in frameworks()}
    name = aliases().get(name, name)
    if name not in known:
        near = get_close_matches(name.lower(), list(known), n=2, cutoff=0.5)
        hint = f" Did you mean {' or '.join(near)}?" if near else ""
        raise LoraflowError(f"unknown framework `{name}`: loraflow check reads {', '.join(known)}.{hint}")
    return known[name]


def aliases() -> dict[str, str]:
    """Every other spelling of a framework's name -> its name, from the declarations."""
    return {alias: f.name for f in frameworks() for alias in f.aliases}


def release_names() -> tuple[str, ...]:
    """The frameworks whose own release is a version `check` reads (`--versions openrlhf=0.5.9`)."""
    return tuple(f.name for f in frameworks() if f.dated)


def parse_versions(text: str) -> dict:
    """`--versions` of `loraflow check`: the tracked packages (environment.parse_versions) and the releases of the
    frameworks that declare them, under any of their spellings."""
    from loraflow.environment import parse_versions as packages

    return packages(text, release_names(), aliases())


def framework_of_log(text: str) -> str | None:
    """The framework whose code a log's traceback runs through (first match in dispatch order)."""
    import re

    for f in frameworks():
        if f.log_paths and re.search(f.log_paths, text):
            return f.name
    return None


def flags_for(name: str) -> dict[str, str]:
    """Combination field -> that framework's flag or key, in its usual spelling (for wording fixes without a
    command)."""
    return dict(framework(name).flags)


@dataclass
class CommandView:
    """A launch command as the recognisers read it."""
    program: str
    dotted: str
    cli: str | None
    flags: set[str]
    yaml_keys: set[str]
    positionals: list[str]
    launcher: str | None = None

    def runs(self, package: str) -> bool:
        """`python -m package.x`, `package/x.py`: the program is inside `package`."""
        return self.dotted.startswith(f"{package}.") or f".{package}." in self.dotted


