"""Other frameworks' command lines and config files -> loraflow's normalized Setup, for `loraflow check`.

Interface (one module per framework, registered in FRONTENDS):
  result = from_command(argv, versions)            # argv: the launch line after `loraflow check --`
  result = from_files(framework, paths, versions)   # `loraflow check --framework NAME FILE...`
A FrontendResult carries the Setup, where each field's value came from (a flag, a file key, or the framework's own
default with the source file that sets it), the flags it did not understand (listed, never ignored), and the
framework's flag for each Setup field so fixes can name the exact flag to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from difflib import get_close_matches
from importlib import import_module

from loraflow.rules.setup import Setup


@dataclass
class FrontendResult:
    framework: str
    setup: Setup
    sources: dict[str, str] = field(default_factory=dict)
    """Setup field -> where its value came from: `--zero_stage 3`, `ds.json: zero_optimization.stage`,
    or `default (openrlhf/cli/train_sft.py)`."""
    unknown: list[str] = field(default_factory=list)
    """Flags or keys this frontend did not understand; printed, never silently ignored."""
    notes: list[str] = field(default_factory=list)
    flags: dict[str, str] = field(default_factory=dict)
    """Setup field -> this framework's flag or key that changes it (used to word fixes)."""


FRAMEWORKS = ("openrlhf", "deepspeed-chat", "hf", "llama-factory", "ms-swift", "axolotl", "deepspeed")
FRONTENDS = {"openrlhf": "openrlhf", "deepspeed-chat": "deepspeed_chat", "hf": "hf", "llama-factory": "llama_factory",
             "ms-swift": "ms_swift", "axolotl": "axolotl", "deepspeed": "deepspeed"}
TITLES = {"openrlhf": "OpenRLHF", "deepspeed-chat": "DeepSpeed-Chat", "hf": "HF Trainer / TRL",
          "llama-factory": "LLaMA-Factory", "ms-swift": "ms-swift", "axolotl": "Axolotl",
          "deepspeed": "DeepSpeed config"}


def _module(framework: str):
    from loraflow.errors import LoraflowError

    if framework not in FRONTENDS:
        near = get_close_matches(framework.lower(), FRAMEWORKS, n=2, cutoff=0.5)
        hint = f" Did you mean {' or '.join(near)}?" if near else ""
        raise LoraflowError(f"unknown framework `{framework}`: loraflow check reads {', '.join(FRAMEWORKS)}.{hint}")
    return import_module(f"loraflow.frontends.{FRONTENDS[framework]}")


# Where a traceback runs through a framework's own code, its path says which one produced the log.
_LOG_PATHS = (
    ("openrlhf", r"openrlhf[/\\]|openrlhf\.cli"),
    ("deepspeed-chat", r"dschat[/\\]|DeepSpeed-Chat|deepspeed_chat|applications[/\\]DeepSpeed-Chat"),
    ("llama-factory", r"llamafactory[/\\]|llamafactory-cli|LLaMA-Factory"),
    ("ms-swift", r"[/\\]swift[/\\](llm|trainers|cli)[/\\]|swift (sft|rlhf)"),
    ("axolotl", r"axolotl[/\\]"),
    ("hf", r"trl[/\\]trainer[/\\]|transformers[/\\]trainer\.py|accelerate[/\\]accelerator\.py"),
)


def framework_of_log(text: str) -> str | None:
    import re

    for name, pattern in _LOG_PATHS:
        if re.search(pattern, text):
            return name
    return None


def flags_for(framework: str) -> dict[str, str]:
    """Setup field -> that framework's flag or key, in its usual spelling (for wording fixes without a command)."""
    return dict(_module(framework).FLAGS)


def detect(argv: list[str]) -> str:
    """Which framework a launch command line belongs to."""
    from loraflow.frontends.argv import split_command

    return _detect(split_command(argv))


# Config-file keys that only one framework uses (a YAML on a launch line, or a file handed to `loraflow check`).
_FILE_MARKERS = (("llama-factory", frozenset({"finetuning_type", "lora_target", "template", "stage"})),
                 ("axolotl", frozenset({"base_model", "adapter", "datasets", "sequence_len"})))


def guess_framework_for_files(paths) -> str | None:
    """The framework whose config file `paths` holds, judged by its keys - for the error `loraflow check FILE` gives
    when FILE is not a loraflow config, to suggest `--framework NAME`. None when the files look like loraflow's own
    config (a typo in one is not another framework), cannot be read, or match no framework clearly. Never raises."""
    from dataclasses import fields

    from loraflow.config.schema import Config
    from loraflow.errors import LoraflowError
    from loraflow.frontends import keys
    from loraflow.frontends.common import load_mapping

    own = {f.name for f in fields(Config)}
    known = {"llama-factory": keys.LLAMA_FACTORY | keys.HF_TRAINER, "axolotl": keys.AXOLOTL}
    for path in paths:
        try:
            found = {str(k) for k in load_mapping(path, "config file")}
        except (LoraflowError, OSError, TypeError, ValueError):
            continue
        if "zero_optimization" in found:
            return "deepspeed"
        foreign = found - own
        for name, markers in _FILE_MARKERS:
            # A marker outside loraflow's own keys, and most of the other keys are that framework's too.
            hits = foreign & known[name]
            if foreign & markers and len(hits) >= 2 and 2 * len(hits) >= len(foreign):
                return name
        hf = foreign & (keys.HF_TRAINER | keys.TRL | keys.HF_EXAMPLES)
        if "output_dir" in found and len(hf) >= 3 and 2 * len(hf) >= len(foreign):
            return "hf"  # TrainingArguments always need output_dir
    return None


def _detect(cmd) -> str:
    from pathlib import Path

    from loraflow.errors import LoraflowError
    from loraflow.frontends.argv import parse_flags, resolve_path

    program = cmd.program.replace("\\", "/")
    dotted = program.removesuffix(".py").replace("/", ".")
    by_cli = {"trl": "hf", "swift": "ms-swift", "llamafactory-cli": "llama-factory", "lmf": "llama-factory",
              "axolotl": "axolotl"}
    if cmd.program_kind == "cli" and program in by_cli:
        return by_cli[program]
    for prefix, name in (("openrlhf.", "openrlhf"), ("axolotl.", "axolotl"), ("llamafactory.", "llama-factory"),
                         ("swift.", "ms-swift"), ("trl.", "hf")):
        if dotted.startswith(prefix) or f".{prefix}" in dotted:
            return name
    args, positionals, _ = parse_flags(cmd.args)
    names = {a.name for a in args}
    from loraflow.frontends.deepspeed_chat import DISTINCT

    if "DeepSpeed-Chat" in program or "_finetuning/" in program or names & DISTINCT:
        return "deepspeed-chat"
    for pos in positionals:
        path = resolve_path(pos)
        if pos.endswith((".yaml", ".yml")) and path is not None:
            from loraflow.frontends.common import load_mapping

            found = set(load_mapping(path, "config file"))
            for name, markers in _FILE_MARKERS:
                if found & markers:
                    return name
        if pos.endswith((".yaml", ".yml")) and Path(program).name == "train.py" and "src" in program:
            return "llama-factory"  # LLaMA-Factory's src/train.py CONFIG.yaml (file not here to peek into)
    from loraflow.frontends import keys

    if program.endswith(".py") and names & (keys.HF_TRAINER | keys.TRL | keys.HF_EXAMPLES):
        return "hf"
    raise LoraflowError(f"cannot tell which framework `{cmd.describe()}` belongs to. loraflow check reads "
                        f"{', '.join(FRAMEWORKS)}; name it with --framework NAME (e.g. `loraflow check --framework hf "
                        f"-- python train.py ...`).")


def from_command(argv: list[str], versions: dict, framework: str | None = None) -> FrontendResult:
    from loraflow.frontends.argv import split_command

    cmd = split_command(argv)
    name = framework or _detect(cmd)
    result = _module(name).from_command(cmd, versions)
    result.notes[:0] = cmd.notes
    return result


def from_files(framework: str, paths: list[str], versions: dict) -> FrontendResult:
    from loraflow.errors import LoraflowError

    module = _module(framework)
    if not paths:
        raise LoraflowError(f"--framework {framework} needs at least one file (a config or a launch script), or give "
                            f"the launch command after `--`.")
    return module.from_files(list(paths), versions)


def run_check(argv: list[str] | None, framework: str | None, files: list[str], versions: dict,
              as_json: bool) -> tuple[str, int]:
    """Build the setup from a command line or files, evaluate the rules as they stand (nothing is fixed: loraflow
    does not run this setup), and render the report. Exit code: 2 crash/silent findings, 1 slow findings or
    unknown flags, 0 clean."""
    from loraflow.errors import LoraflowError
    from loraflow.frontends.report import render

    if argv and files:
        raise LoraflowError("give either the launch command after `--` or files with --framework, not both "
                            f"(files: {' '.join(files)}).")
    if argv:
        result = from_command(list(argv), versions, framework)
    elif framework:
        result = from_files(framework, files, versions)
    else:
        raise LoraflowError("nothing to check: put the launch command after `--`, or pass --framework NAME with "
                            f"config files ({', '.join(FRAMEWORKS)}).")
    return render(result, as_json)
