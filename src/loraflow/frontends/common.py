"""What every frontend shares: a draft Combination that remembers where each value came from, version tests, config
files (YAML/JSON) and accelerate's launch configuration (a `--config_file` YAML and `accelerate launch` flags)."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from loraflow.errors import LoraflowError
from loraflow.families import DEFAULT, EMBEDDING_NAMES, HEAD_NAMES
from loraflow.frontends.argv import Command, parse_bool, visible_devices
from loraflow.frontends.base import FrontendResult
from loraflow.frontends.config_text import EXCERPTS, close_cut, cut_off, json_piece
from loraflow.frontends.scenarios import intersect
from loraflow.rules.combination import Combination

_DEFAULTS = {f.name: f.default for f in fields(Combination) if f.name != "versions"}
FORK = "fork:"
"""Prefix of the keys that carry a fork's value into a build, beside the versions (Draft.fork)."""


class Draft:
    """Combination values with their sources; `default()` never overrides what a flag or file already set.

    `versions` are the package versions of this evaluation: the ones the user gave, plus, in a scenario, the
    release assumed for each unknown one. Every comparison a frontend makes against a version is recorded
    (`queried`), so `check` knows which unknown versions change the setup; `era()` records what a flag spelling
    reveals about a release, and `maybe()` a choice the user's own script makes where no flag shows it."""

    def __init__(self, framework: str, versions: dict[str, Version | None]):
        self.framework = framework
        self.versions = {k: v for k, v in versions.items() if v is not None and not k.startswith(FORK)}
        self.forks: dict[str, tuple[dict[Any, str], str]] = {}
        self._forked = {k.removeprefix(FORK): v for k, v in versions.items() if k.startswith(FORK)}
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.flags: dict[str, str] = {}
        self.unknown: list[str] = []
        self.stops: list[str] = []
        self.notes: list[str] = []
        self.queried: dict[str, set[Version]] = {}
        self.eras: dict[str, tuple[str, str]] = {}
        self.unsure: dict[str, tuple[dict[Any, str], str]] = {}
        self.mixed_eras: set[str] = set()
        self.firm_eras: set[str] = set()
        """Packages whose spellings contradict each other (no release has them all): not dated at all."""

    def set(self, name: str, value: Any, source: str) -> None:
        if name not in _DEFAULTS:
            raise KeyError(f"{name} is not a Combination field")
        self.values[name] = value
        self.sources[name] = source

    def settle(self, name: str, value: Any, source: str) -> None:
        """A fact of the framework's own code: set, and no longer the question an earlier reader (the model's name)
        asked. `set` keeps such a question, since some frontends set a baseline and still evaluate the others."""
        self.set(name, value, source)
        self.unsure.pop(name, None)

    def default(self, name: str, value: Any, source: str) -> None:
        if name not in self.values:
            self.set(name, value, f"default ({source})")

    def get(self, name: str) -> Any:
        return self.values.get(name, _DEFAULTS[name])

    def has(self, name: str) -> bool:
        return name in self.values

    def stop(self, text: str) -> None:
        """The framework (or a library it calls) refuses this launch before its first step: a check of its own that
        the command or its files fail, whatever the versions check could not see. The launch fails as given."""
        if text not in self.stops:
            self.stops.append(text)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def flag(self, **mapping: str) -> None:
        self.flags.update(mapping)

    def version(self, package: str) -> Version | None:
        return self.versions.get(package)

    def era(self, package: str, spec: str, reason: str, firm: bool = False) -> None:
        """The command reveals the release range of `package` (a flag spelling, a file layout): scenarios outside
        it are not evaluated. `firm`: the range follows from versions the user gave (what installs with them), which
        outweighs a spelling where the two disagree."""
        if self.version(package) is not None or package in self.mixed_eras:
            return
        if package in self.eras:  # several spellings: the releases that have all of them
            old_spec, old_reason = self.eras[package]
            joined = intersect(f"{old_spec},{spec}")
            if joined is None:  # no release has both
                self._contradiction(package, spec, reason, firm)
                return
            self.notes = [n for n in self.notes if not n.startswith(f"{package} release not given:")]
            spec, reason = joined, f"{old_reason}; {reason}"
        else:
            spec = intersect(spec) or spec
        self.eras[package] = (spec, reason)
        if firm:
            self.firm_eras.add(package)
        self.note(f"{package} release not given: {reason}, so only {package}{spec} is considered")

    def _contradiction(self, package: str, spec: str, reason: str, firm: bool) -> None:
        """Two clues no single release satisfies: the firm one (from the versions given) stands, the spelling is
        said to disagree; two spellings from different releases (flags copied from several versions' docs) date
        nothing."""
        old_spec, old_reason = self.eras[package]
        old_firm = package in self.firm_eras
        if old_firm != firm:
            if firm:
                self.eras[package] = (spec, reason)
                self.firm_eras.add(package)
                self.notes = [n for n in self.notes if not n.startswith(f"{package} release not given:")]
                self.note(f"{package} release not given: {reason}, so only {package}{spec} is considered")
            kept, dropped = (reason, old_reason) if firm else (old_reason, reason)
            self.note(f"{package}: {dropped}, which no release allowed by the versions given has ({kept})")
            return
        del self.eras[package]
        self.mixed_eras.add(package)
        self.notes = [n for n in self.notes if not n.startswith(f"{package} release not given:")]
        self.note(f"{package} release not given, and the command mixes spellings no single release has "
                  f"({old_reason}; {reason}): every release is considered")

    def eras_from(self, package: str, title: str, table, present, prefix: str = "") -> None:
        """Each entry of a framework's era table, `(key, spec)` or `(shown, key, spec)`, whose key is in `present`
        dates the release: the key exists only in `spec`."""
        for entry in table:
            shown, key, spec = entry if len(entry) == 3 else (prefix + entry[0], *entry)
            if key in present:
                self.era(package, spec, f"{shown} exists in {title} {spec}")

    def maybe(self, name: str, labels: dict[Any, str], why: str) -> None:
        """A Combination field the user's own code decides where no flag shows it: every value is evaluated."""
        if name not in _DEFAULTS:
            raise KeyError(f"{name} is not a Combination field")
        self.unsure[name] = (labels, why)

    def fork(self, name: str, labels: dict[Any, str], why: str) -> Any:
        """A choice that a file which is not here makes, and that the rest of the setup is read from (the engine an
        unseen accelerate config selects): `check` builds the setup once per value, so what follows from each is
        read as the framework reads it (unlike `maybe`, which only overrides one field). Returns this build's
        value: the one `check` asks for, else the first."""
        self.forks[name] = (dict(labels), why)
        return self._forked.get(name, next(iter(labels)))

    def result(self) -> FrontendResult:
        setup = Combination(**self.values, versions=dict(self.versions))
        return FrontendResult(self.framework, setup, dict(self.sources), list(dict.fromkeys(self.unknown)),
                              list(self.notes), dict(self.flags), {k: set(v) for k, v in self.queried.items()},
                              dict(self.eras), dict(self.unsure), dict(self.forks), list(self.stops))


def mitigated(draft: Draft, rule: str) -> bool:
    """Whether the framework's release in this evaluation works around `rule` (its Framework.mitigations); `check`
    evaluates the releases on both sides of the one that brought the workaround. A rule the framework declares no
    mitigation for raises KeyError: the declaration is the one place its release is written."""
    from loraflow.frontends.base import framework

    found = [m for m in framework(draft.framework).mitigations if rule in m.rules]
    if not found:
        raise KeyError(f"{draft.framework} declares no mitigation of {rule}")
    return at_least(draft, found[0].package or draft.framework, found[0].since)


def at_least(draft: Draft, package: str, version: str) -> bool:
    """`package` >= version for this evaluation. An unknown version reads as a current release; the comparison is
    recorded, and `check` evaluates the releases on both sides of it."""
    boundary = Version(version)
    draft.queried.setdefault(package, set()).add(boundary)
    known = draft.version(package)
    if known is not None:
        return known >= boundary
    if package in draft.eras:  # unknown within a known era: its newest release
        for s in SpecifierSet(draft.eras[package][0]):
            if s.operator == "<=":
                return Version(s.version) >= boundary
            if s.operator == "<":
                return Version(s.version) > boundary
    return True


def load_mapping(path: str | Path, what: str) -> dict[str, Any]:
    """A YAML or JSON file whose top level is a mapping (JSON is valid YAML, but JSON errors read better). Unreadable,
    binary or malformed files raise LoraflowError naming the file (and the line, where the parser says)."""
    import yaml

    p = Path(path)
    kind = "JSON" if p.suffix == ".json" else "YAML"
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise LoraflowError(f"cannot read {what} {path}: {exc.strerror}.") from None
    except UnicodeDecodeError as exc:
        raise LoraflowError(f"{what} {path} is not a text file (byte {exc.start} is not UTF-8); expected {kind}."
                            ) from None
    # Pasted from an issue: markdown fences and Windows line ends (the fence lines are blanked, so line numbers hold).
    text = re.sub(r"(?m)^[ \t]*```.*$", "", text.replace("\r\n", "\n"))
    try:
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        cut = cut_off(text, exc.pos)
        excerpts = EXCERPTS.get()
        read = close_cut(text) if cut and excerpts is not None else None
        if read is None:
            raise LoraflowError(f"{what} {path} is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
                                f"{cut}.") from None
        # `check` reads a pasted excerpt for what it shows, and names what it could not see (exit code 1).
        data, kept = read
        excerpts.append(f"{path} after line {kept}{cut.removesuffix(' (cut short?)')}: read as an excerpt up to "
                        "there; nothing can load the file as it stands")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise LoraflowError(f"{what} {path} is not valid YAML{where}: {problem}{json_piece(text)}.") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise LoraflowError(f"{what} {path} must hold a mapping of keys to values at the top level.")
    return data


def int_value(value: Any, where: str, expected: str = "an integer", choices: tuple[int, ...] = ()) -> int:
    """A flag's or key's whole-number value (`3`, "3", 3.0, a one-item list). Anything else - "auto", "three", a
    missing value, a mapping - raises LoraflowError naming `where` (the flag, key or file) and what was expected."""
    item = value[0] if isinstance(value, (list, tuple)) and len(value) == 1 else value
    number: int | None = None
    if isinstance(item, bool):
        number = None
    elif isinstance(item, int):
        number = item
    elif isinstance(item, float) and item.is_integer():
        number = int(item)
    elif isinstance(item, str) and item.strip().lstrip("+-").isdigit():
        number = int(item.strip())
    if number is None or (choices and number not in choices):
        allowed = f" ({', '.join(map(str, choices))})" if choices else ""
        if item is None or item == []:
            raise LoraflowError(f"{where}: no value given; expected {expected}{allowed}, a whole number.")
        raise LoraflowError(f"{where}: `{item}` is not {expected}{allowed}; write a whole number"
                            f"{' such as ' + str(choices[-1]) if choices else ''}.")
    return number


def mapping_value(value: Any, where: str) -> dict[str, Any]:
    """A nested section (`zero_optimization`, `fsdp_config`, `trl`...): a mapping, or absent. Anything else raises
    LoraflowError naming `where`, instead of failing on `.get`."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    raise LoraflowError(f"{where}: expected a mapping of keys to values (e.g. {{stage: 3}}), got "
                        f"{type(value).__name__} `{value}`.")


def as_bool(value: Any, where: str) -> bool:
    return value if isinstance(value, bool) else parse_bool(None if value is None else str(value), where)


def as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [v for v in str(value).replace(",", " ").split() if v]


def precision_from(bf16: bool, fp16: bool) -> str:
    # bf16/fp16 switches of the HF Trainer and DeepSpeed are autocast (DeepSpeed keeps fp32 master weights), so the
    # trainable weights stay fp32: `-mixed`. Pure half storage is set explicitly by the frontends that have it.
    return "bf16-mixed" if bf16 else ("fp16-mixed" if fp16 else "fp32")


# Checkpoints whose config.json sets tie_word_embeddings: true (embed_tokens and lm_head share one matrix), by name.
_TIED = re.compile(r"qwen(2(\.5)?|3)[-_]?(0\.5|0\.6|1\.5|1\.7|3|4)b|gemma|llama-?3\.2-?(1|3)b|smollm|gpt2|"
                   r"(^|/)opt-|phi-?1|tinyllama", re.I)


def embedding_targets(draft: Draft, names: list[str], source: str, model: str = "") -> None:
    """modules_to_save / additional targets that train the embeddings or the output head. Whether the model ties
    them (tie_word_embeddings) decides rule tied-embedding-adapter: read from the model's name where it is known.
    A name is any family's (families.EMBEDDING_NAMES, HEAD_NAMES), or a full path ending in Llama's."""
    if any(n in EMBEDDING_NAMES or n.endswith(DEFAULT.embedding) for n in names):
        draft.set("embeddings_trainable", True, source)
    if any(n in HEAD_NAMES or n.endswith(DEFAULT.head) for n in names):
        draft.set("lm_head_trainable", True, source)
    if not (draft.get("embeddings_trainable") or draft.get("lm_head_trainable")):
        return
    if model and _TIED.search(model):
        draft.set("tied_embeddings", True, f"{model} ties its word embeddings (config.json tie_word_embeddings: true)")
    else:
        draft.maybe("tied_embeddings", {True: "the model ties embed_tokens and lm_head (tie_word_embeddings)",
                                        False: "the model does not tie them"},
                    f"whether {model or 'the model'} ties its word embeddings is in its config.json, not visible here")


# What a config's file name says about it: `ds_config_zero3.json`, `zero_stage3_config.json`, `ds_z2_offload.json`,
# `deepspeed_config_s2.json`, ms-swift's `default-zero3`. Read for DeepSpeed configs (deepspeed.infer_from_name) and
# accelerate configs (accelerate_options._accelerate_from_name) alike, so it lives here, below both.
OFFLOAD_IN_NAME = re.compile(r"(?<!no)(?<!no_)(?<!no-)(?<!without_)(?<!wo_)(?<!non_)offload")
"""`ds_z3_offload.json` offloads; `ds_zero2_no_offload.json` (DeepSpeed-Chat's and many repos' name) does not."""
STAGE_IN_NAME = re.compile(r"(?:zero|stage|ds_?z|z)[_-]?(?:stage)?[_-]?([0-3])(?![0-9])|(?<![a-z])s([0-3])(?![0-9])")

def world_from_env(draft: Draft, cmd: Command, all_visible: bool) -> None:
    """World size for CLIs that start torchrun themselves (llamafactory-cli, swift): NPROC_PER_NODE x NNODES, else
    every visible device when `all_visible` (LLaMA-Factory launches one process per device)."""
    if cmd.world_size is not None:
        return
    nproc = cmd.env.get("NPROC_PER_NODE")
    if nproc and nproc.isdigit():
        nodes = int_value(cmd.env.get("NNODES") or 1, f"NNODES={cmd.env.get('NNODES')}", "a number of nodes")
        cmd.world_size, cmd.world_source = int(nproc) * nodes, f"NPROC_PER_NODE={nproc} NNODES={nodes}"
        return
    count, source = visible_devices(cmd)
    nodes = cmd.env.get("NNODES", "")
    if nodes.isdigit() and int(nodes) > 1:
        # NNODES alone: torchrun over that many nodes with LLaMA-Factory's NPROC_PER_NODE default, the node's
        # device count (launcher.py), or torchrun's own default of one process per node under swift (cli/main.py
        # passes --nproc_per_node only when NPROC_PER_NODE is set).
        per_node = count if all_visible and count else 1
        cmd.world_size = int(nodes) * per_node
        cmd.world_source = f"NNODES={nodes} x {source}" if per_node > 1 else (
            f"NNODES={nodes}: at least one process on each node" if all_visible else
            f"NNODES={nodes}, one process per node (torchrun's default --nproc_per_node 1)")
        return
    if all_visible and count:
        cmd.world_size, cmd.world_source = count, source
    elif all_visible and not cmd.hidden_launcher_options:
        # No CUDA_VISIBLE_DEVICES: as many processes as the machine has GPUs (LLaMA-Factory's cli.py runs torchrun
        # when get_device_count() > 1), which the command does not show: both are evaluated. Users' launches
        # (okeeper/LLaMA-Factory qwen/train.sh) run `llamafactory-cli train` so on multi-GPU machines.
        draft.maybe("world_size", {1: "the machine has one GPU", 2: "the machine has several GPUs"},
                    "llamafactory-cli train starts one process per visible GPU (cli.py: torchrun when "
                    "get_device_count() > 1)")


def trainer_dtypes(draft: Draft, base_half: bool, dtype_source: str) -> None:
    """What the HF Trainer and PEFT do to an adapter model under FSDP1 and ZeRO-3, for every framework built on them.

    - Float32 beside a half-precision base: k-bit preparation keeps the weights it does not quantize in float32, and
      PEFT >= 0.12 keeps adapters of a half-precision base in float32 (autocast_adapter_dtype).
    - Since transformers 4.39 (`Trainer._fsdp_qlora_plugin_updates`) a LoRA model under FSDP1 is wrapped with PEFT's
      fsdp_auto_wrap_policy, which puts the adapter leaves in units of their own; PEFT < 0.11 called a helper
      accelerate had moved, so the policy was not applied (peft PR #1694)."""
    sharded = draft.get("engine") == "fsdp1" or (draft.get("engine") == "deepspeed" and draft.get("zero_stage") == 3)
    if not sharded or draft.get("adapter") == "full":
        return
    if draft.get("quantization") in ("4bit", "8bit"):
        draft.set("mixed_param_dtypes", True, "k-bit preparation keeps the non-quantized weights in float32")
    elif base_half and at_least(draft, "peft", "0.12.0"):
        draft.set("mixed_param_dtypes", True, f"{dtype_source}: a half-precision base, and peft >= 0.12 keeps "
                  "adapters in float32 (autocast_adapter_dtype)")
    if draft.get("engine") == "fsdp1":
        separate = at_least(draft, "transformers", "4.39.0") and at_least(draft, "peft", "0.11.0")
        draft.default("fsdp_frozen_units_separate", separate,
                      "transformers >= 4.39 Trainer wraps PEFT adapters as their own FSDP units (peft >= 0.11)"
                      if separate else "the Trainer's adapter wrap policy is missing (transformers < 4.39) or "
                      "broken (peft < 0.11)")


def one_process_ddp(draft: Draft, cmd: Command | None) -> None:
    """The HF Trainer under torchrun (or the deepspeed launcher) with a single process: LOCAL_RANK is set, so
    accelerate picks MULTI_GPU (state.py _prepare_backend) and, before 1.10.0, prepare_model wrapped the model in
    DDP on that type alone; 1.10.0 (PR #3682, multi_device) also asks for more than one process. The Trainer's own
    wrapping before it used accelerate did the same on local_rank != -1."""
    if cmd is None or cmd.launcher not in ("torchrun", "deepspeed") or draft.has("engine") or cmd.world_size not in (
            None, 1):
        return
    if not at_least(draft, "accelerate", "1.10.0"):
        draft.set("engine", "ddp", f"{cmd.launcher} with one process sets LOCAL_RANK, and accelerate < 1.10 wraps the "
                  "model in DDP whenever it is set (accelerator.py prepare_model)")


def finish_world(draft: Draft, cmd: Command | None) -> None:
    if cmd is not None and cmd.world_size:
        draft.set("world_size", cmd.world_size, cmd.world_source or "launcher")
    elif not draft.has("world_size") and cmd is not None and cmd.hidden_launcher_options:
        # The process count may sit in the unset variable: both are evaluated (verdict.py keeps engine single/ddp
        # in step with it).
        draft.maybe("world_size", {1: "one process", 2: "several processes"},
                    f"the process count is not in the command: {', '.join(cmd.hidden_launcher_options)}")
    elif not draft.has("world_size") and cmd is not None and cmd.launcher == "deepspeed":
        # `deepspeed train.py` without --num_gpus / --include starts one process per GPU of the machine
        # (deepspeed/launcher/runner.py takes every local device), which the command does not show.
        draft.maybe("world_size", {1: "the machine has one GPU", 2: "the machine has several GPUs"},
                    "deepspeed without --num_gpus / --include starts one process per visible GPU")
    elif not draft.has("world_size") and "world_size" not in draft.unsure:
        draft.note("number of processes not visible in the command: assumed 1 (pass the launcher's "
                   "--num_gpus / --nproc_per_node / --num_processes to check multi-process setups)")
    if not draft.has("engine"):
        multi = draft.get("world_size") > 1
        draft.set("engine", "ddp" if multi else "single",
                  "more than one process, no DeepSpeed or FSDP" if multi else "one process")


def read_keyed_files(paths: list[str], label: str, keep_null: bool = True,
                     inspect=None) -> tuple[dict[str, tuple[Any, str]], list[Path]]:
    """The top-level keys of several YAML/JSON files as {key: (value, "file: key")}, later files winning, plus the
    files' folders (to resolve relative paths in them). A DeepSpeed JSON among the files replaces the `deepspeed:`
    key, as passing it beside an Axolotl or LLaMA-Factory YAML means. `inspect(path, data)` may refuse a file."""
    found: dict[str, tuple[Any, str]] = {}
    bases: list[Path] = []
    ds_files: list[str] = []
    for path in paths:
        data = load_mapping(path, label)
        bases.append(Path(path).parent)
        if "zero_optimization" in data:
            ds_files.append(str(path))
            continue
        if inspect is not None:
            inspect(path, data)
        for key, value in data.items():
            if keep_null or value is not None:
                found[key] = (value, f"{Path(path).name}: {key}")
    for path in ds_files:
        found["deepspeed"] = (path, path)
    return found, bases


def accessors(options: dict[str, tuple[Any, str]]):
    """get(name, default), src(name) and on(name, default) over {key: (value, where it came from)}: how the YAML
    frontends read their merged options. A key set to null counts as unset."""
    def get(name: str, default: Any = None) -> Any:
        return options[name][0] if name in options else default

    def src(name: str) -> str:
        return options[name][1]

    def on(name: str, default: bool = False) -> bool:
        return as_bool(get(name), src(name)) if get(name) is not None else default
    return get, src, on


def yaml_null(text: str) -> bool:
    """Whether an override's value is YAML's null (`null`, `~`, `Null`, an empty value): OmegaConf reads a dotlist
    value as YAML (OmegaConf.from_dotlist / merge_with_dotlist), and a null there removes the config's key."""
    import yaml

    try:
        return yaml.safe_load(text) is None
    except yaml.YAMLError:
        return False
