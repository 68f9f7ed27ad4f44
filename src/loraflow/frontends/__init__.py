"""Other frameworks' command lines and config files -> loraflow's normalized Combination, for `loraflow check`.

Interface (one module per framework, each declaring itself once in a module-level FRAMEWORK; _MODULES in base.py is
the dispatch order). A new framework is one module - its FRAMEWORK, its flag table (table.Field rows: field, flags,
parser, default per release with its source) applied by table.apply_table, its stage names through
table.STAGE_ALIASES, and from_command / from_files - plus its name in base._MODULES:
  result = from_command(argv, versions)            # argv: the launch line after `loraflow check --`
  result = from_files(framework, paths, versions)   # `loraflow check --framework NAME FILE...`
A FrontendResult carries the Combination, where each field's value came from (a flag, a file key, or the framework's own
default with the source file that sets it), the flags it did not understand (listed, never ignored), and the
framework's flag for each Combination field so fixes can name the exact flag to change.
"""

from __future__ import annotations

from importlib import import_module

# The types and the framework table live in base.py so frontend modules can use them without importing this package
# (which imports them); re-exported here for callers outside the package.
from loraflow.frontends.base import (  # noqa: F401
    CommandView,
    Framework,
    FrontendResult,
    flags_for,
    framework,
    framework_of_log,
    frameworks,
    parse_versions,
)


def _module(name: str):
    return import_module(f"loraflow.frontends.{framework(name).module}")


def __getattr__(attr: str):
    # FRAMEWORKS and TITLES are read from the declarations, never listed a second time.
    if attr == "FRAMEWORKS":
        return tuple(f.name for f in frameworks())
    if attr == "TITLES":
        return {f.name: f.title for f in frameworks()}
    raise AttributeError(attr)


def _view(cmd) -> CommandView:
    from loraflow.frontends.argv import parse_flags, resolve_path
    from loraflow.frontends.common import load_mapping

    from loraflow.frontends.hf_options import ARGS_FILE_FLAG, training_args_file

    program = cmd.program.replace("\\", "/")
    args, positionals, _ = parse_flags(cmd.args)
    keys_found: set[str] = set()
    # `train.py --train_args_file args.json`: the file's keys say whose arguments they are, as a lone config does
    # (a DeepSpeed or model config named by such a flag says nothing of the framework).
    named = [str(a.one() or "") for a in args if ARGS_FILE_FLAG.match(a.name) and a.name != "config"
             and training_args_file(a.one(), [])]
    for pos in positionals + named:
        path = resolve_path(pos)
        if pos.endswith((".yaml", ".yml", ".json")) and path is not None:
            data = load_mapping(path, "config file")
            # A section's keys too: vendors nest TrainingArguments under `training_args:` (hf_options.trainer_sections).
            keys_found |= {str(k) for k in data} | {str(k) for v in data.values() if isinstance(v, dict) for k in v}
    return CommandView(program, program.removesuffix(".py").replace("/", "."),
                       program if cmd.program_kind == "cli" else None, {a.name for a in args}, keys_found,
                       positionals, cmd.launcher)


def detect(argv: list[str]) -> str:
    """Which framework a launch command line belongs to."""
    from loraflow.frontends.argv import split_command

    return _detect(split_command(argv))


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
    from loraflow.frontends.nemo_rl import SECTIONS as NEMO_RL
    from loraflow.frontends.verl import TOP_KEYS as VERL

    known = {"llama-factory": keys.LLAMA_FACTORY | keys.HF_TRAINER, "axolotl": keys.AXOLOTL,
             "accelerate": keys.ACCELERATE_TOP, "verl": VERL, "torchtune": keys.TORCHTUNE, "nemo-rl": NEMO_RL}
    for path in paths:
        try:
            found = {str(k) for k in load_mapping(path, "config file")}
        except (LoraflowError, OSError, TypeError, ValueError):
            if _mentions(path, '"zero_optimization"'):
                return "deepspeed"  # a DeepSpeed JSON that does not parse: the error to give is its own
            continue
        if "zero_optimization" in found or _deepspeed_keys(found):
            return "deepspeed"
        foreign = found - own
        for f in frameworks():
            # A marker outside loraflow's own keys, and most of the other keys are that framework's too.
            hits = foreign & known.get(f.name, set())
            if foreign & f.file_markers and len(hits) >= 2 and 2 * len(hits) >= len(foreign):
                return f.name
        hf = foreign & (keys.HF_TRAINER | keys.TRL | keys.HF_EXAMPLES)
        if "output_dir" in found and len(hf) >= 3 and 2 * len(hf) >= len(foreign):
            return "hf"  # TrainingArguments always need output_dir
    return None


# Top-level keys only a DeepSpeed config has (the HF Trainer spells its own max_grad_norm, per_device_train_batch_size).
_DEEPSPEED_ONLY = frozenset({"train_micro_batch_size_per_gpu", "train_batch_size", "steps_per_print",
                             "wall_clock_breakdown", "gradient_clipping", "zero_allow_untested_optimizer"})


def _deepspeed_keys(found: set[str]) -> bool:
    """A DeepSpeed JSON without a zero_optimization section (or with it misspelled, `zero-optimization`): two keys
    only DeepSpeed has, and most of its keys DeepSpeed's."""
    from loraflow.frontends import keys

    ours = {k.replace("-", "_") for k in found} & keys.DEEPSPEED_TOP
    return len(found & _DEEPSPEED_ONLY) >= 2 and 2 * len(ours) >= len(found)


def _mentions(path, text: str) -> bool:
    try:
        return text in open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        return False


def _detect(cmd) -> str:
    from loraflow.errors import LoraflowError

    view = _view(cmd)
    for f in frameworks():
        if f.recognise is not None and f.recognise(view):
            return f.name
    names = ", ".join(f.name for f in frameworks())
    raise LoraflowError(f"cannot tell which framework `{cmd.describe()}` belongs to. loraflow check reads {names}; "
                        f"name it with --framework NAME (e.g. `loraflow check --framework hf -- python train.py ...`).")


def from_command(argv: list[str], versions: dict, name: str | None = None) -> FrontendResult:
    from loraflow.frontends.argv import split_command

    cmd = split_command(argv)
    result = _module(name or _detect(cmd)).from_command(cmd, versions)
    result.notes[:0] = cmd.notes
    return result


def from_files(name: str, paths: list[str], versions: dict) -> FrontendResult:
    from loraflow.errors import LoraflowError

    module = _module(name)
    if not paths:
        raise LoraflowError(f"--framework {name} needs at least one file (a config or a launch script), or give "
                            f"the launch command after `--`.")
    return module.from_files(list(paths), versions)


def launch_builder(path: str, name: str | None) -> tuple:
    """`explain --launch FILE [--framework NAME]`: the run's launch script or config as `check` builds it - (a
    function of the versions to its FrontendResult, a label for the evidence it gives)."""
    from pathlib import Path

    from loraflow.errors import LoraflowError
    from loraflow.frontends.shell import command_from_script

    if not Path(path).is_file():
        raise LoraflowError(f"--launch {path}: no such file; give the run's launch script (.sh) or its config file.")
    if name is None and path.endswith((".sh", ".bash")):
        argv = command_from_script(path)
        return (lambda v: from_command(list(argv), v)), f"--launch {path}"
    name = name or guess_framework_for_files([path])
    if name is None:
        raise LoraflowError(f"--launch {path}: cannot tell which framework this config belongs to; name it with "
                            "--framework NAME (see `loraflow check --help`).")
    return (lambda v: from_files(name, [path], v)), f"--launch {path} ({name})"


def run_check(argv: list[str] | None, name: str | None, files: list[str], versions: dict,
              as_json: bool, data: str | None = None, dated=None) -> tuple[str, int]:
    """Build the setup from a command line or files, evaluate the rules as they stand (nothing is fixed: loraflow
    does not run this setup) over every unknown version and choice, and render the report. Exit code: 2 when a
    crash/silent finding holds whatever is unknown, 1 when one depends on what check could not see or a flag was not
    understood, 0 when nothing found fails or trains wrongly. `data`: the run's data file, which settles the choices
    the samples decide. `dated` (versions_source.Dated): the releases in `versions` that --as-of filled, which yield
    to the launch's own era evidence."""
    from loraflow.errors import LoraflowError
    from loraflow.frontends.report import render
    from loraflow.frontends.verdict import check_setup

    if argv and files:
        raise LoraflowError("give either the launch command after `--` or files with --framework, not both "
                            f"(files: {' '.join(files)}).")
    if argv:
        def build(v: dict) -> FrontendResult:
            return from_command(list(argv), v, name)
    elif name:
        def build(v: dict) -> FrontendResult:
            return from_files(name, files, v)
    else:
        names = ", ".join(f.name for f in frameworks())
        raise LoraflowError(f"nothing to check: put the launch command after `--`, or pass --framework NAME with "
                            f"config files ({names}).")
    if data:  # `--data FILE`: the choices the samples decide are settled from them (frontends/data_facts.py)
        from loraflow.frontends import data_facts

        facts, read_setup = data_facts.read(data), build

        def build(v: dict) -> FrontendResult:
            result = read_setup(v)
            data_facts.apply(result, facts)
            result.notes.append(f"--data {facts.describe()}")
            return result
    # Config files cut short (pasted excerpts) are read up to where they stop; what they leave out is named.
    from loraflow.frontends.config_text import EXCERPTS
    from loraflow.frontends.shell import SCRIPT_DIRS

    excerpts: list[str] = []
    token, dirs = EXCERPTS.set(excerpts), SCRIPT_DIRS.set(())
    read = build

    def build(v: dict) -> FrontendResult:
        result = read(v)
        result.unknown += [e for e in dict.fromkeys(excerpts) if e not in result.unknown]
        return result
    try:
        if dated is not None:
            from loraflow.frontends.versions_source import within_eras

            versions = within_eras(build, versions, dated)
            said = [f"{p} {'release not fixed' if v is None else v} (--as-of {dated.day}): {why}"
                    for p, (v, why) in dated.moved.items()]
            dated_read = build

            def build(v: dict) -> FrontendResult:
                result = dated_read(v)
                result.notes += [n for n in said if n not in result.notes]
                return result
        return render(check_setup(build, versions), as_json)
    finally:
        EXCERPTS.reset(token)
        SCRIPT_DIRS.reset(dirs)
