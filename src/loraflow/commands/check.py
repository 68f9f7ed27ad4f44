"""`loraflow check`: a loraflow config planned against the installed stack, or another framework's launch read by
the frontends (frontends/) over every release of what it does not state."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from loraflow.errors import LoraflowError
from loraflow.stagespec import STAGE_NAMES as STAGES

def split_config_and_overrides(items: list[str]) -> tuple[str | None, list[str]]:
    """`loraflow train sft [CONFIG.yaml] [key=value ...]`: the config is the one argument without `=`."""
    paths = [i for i in items if "=" not in i]
    if len(paths) > 1:
        raise LoraflowError(f"expected one config file, got {len(paths)}: {' '.join(paths)}. Overrides are key=value.")
    return (paths[0] if paths else None), [i for i in items if "=" in i]


def _versions(args: argparse.Namespace):
    from loraflow.environment import detect_environment, with_versions
    from loraflow.frontends import parse_versions

    given = "" if (args.versions or "").strip() == "installed" else (args.versions or "")
    env = with_versions(detect_environment(), parse_versions(given))
    nproc = getattr(args, "nproc", None)
    if nproc is not None:
        import dataclasses

        if nproc < 1:
            raise LoraflowError(f"--nproc {nproc}: give the number of processes the run will launch (>= 1).")
        env = dataclasses.replace(env, world_size=nproc)
    return env


CHECK_UNREAD = 3  # check's input unreadable: no verdict (2 is "the launch fails", 1 "it depends", 0 "nothing found")


def cmd_check(args: argparse.Namespace) -> int:
    if args.command_line is not None or args.framework:
        return _check_foreign(args, args.command_line, args.framework, args.items if args.framework else [])
    config_path, overrides = split_config_and_overrides(args.items)
    if config_path and Path(config_path).suffix == ".sh" and not overrides:
        # A launch script is another framework's command line: `loraflow check run.sh` == `check -- bash run.sh`.
        return _check_foreign(args, ["bash", config_path], None, [])
    if config_path and Path(config_path).suffix == ".py" and not overrides:
        # A training script is read statically (never run): `loraflow check train.py` == `--framework python`.
        return _check_foreign(args, None, "python-script", [config_path])
    if args.data:
        raise LoraflowError("--data is for another framework's run (after `--`, or with --framework); a loraflow "
                            "config names its data in data.train, which check reads itself.")
    env = _versions(args)
    from loraflow.config import load_config
    from loraflow.errors import ConfigError
    from loraflow.plan import resolve
    from loraflow.run.config import starting_config

    if config_path and not Path(config_path).is_file():  # nothing to read: no verdict on a config not seen
        raise LoraflowError(f"config file {config_path} does not exist (from {Path.cwd()}); give its path, or "
                            "pass --framework NAME for another framework's file.")
    start = starting_config(args.stage or "sft", config_path, overrides)
    if args.stage:
        overrides = [f"stage={args.stage}", *overrides]
    try:
        # No config and no model: check the same embedded default that `loraflow train STAGE` would train.
        config = load_config(start, overrides)
    except ConfigError as exc:
        from loraflow.frontends import guess_framework_for_files

        other = guess_framework_for_files([config_path]) if config_path else None
        if not other and config_path and not _loraflow_shaped(config_path):
            raise LoraflowError(f"{config_path} is not a loraflow config (not YAML, or no loraflow section at its "
                                "top level) and its keys are no framework's check recognises; name its framework "
                                f"with --framework NAME. Read as loraflow's: {exc}") from None
        if not other or overrides or args.stage:
            raise
        # Said on stderr so that --json stays one document; the guess is from the file's keys, so name the flag
        # that overrides it.
        print(f"note: {config_path} is not a loraflow config; its keys are {other}'s, so it is read as "
              f"`loraflow check --framework {other} {config_path}` (pass --framework to choose another).",
              file=sys.stderr)
        return _check_foreign(args, None, other, [config_path])
    from loraflow.setup.inputs import check_tokenizer_and_data, inspect_for_check

    # The same inspection `train` runs (model class, attention, adapter targets, merge adapters), on the meta
    # device; a model that cannot be looked at here is said and skipped rather than fatal.
    info, note = inspect_for_check(config)
    plan = resolve(config, env, info)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.render())
    if note:
        print(note, file=sys.stderr)
    elif not config.data.train:
        print("note: data.train is not set, so the data and the tokenizer were not checked (train needs it).",
              file=sys.stderr)
    else:
        # What train does next before building the model: tokenizer against the embedding, then the stage's own
        # load_data, so a bad tokenizer or a malformed record fails here too (LoraflowError: exit 2).
        summary = check_tokenizer_and_data(plan)
        if not args.json:
            print(summary)
    if plan.errors:
        return 2
    return 1 if plan.warnings else 0


def _loraflow_shaped(path: str) -> bool:
    """Whether a file that failed as a loraflow config still is one (a mapping with a loraflow section, so its
    errors are train's refusal, exit 2), rather than a file of another kind check cannot place (exit 3)."""
    import dataclasses

    import yaml

    from loraflow.config.schema import Config

    sections = {f.name for f in dataclasses.fields(Config)}
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:  # a loraflow config with a syntax error still shows its sections at the left margin
        tops = re.findall(r"(?m)^([A-Za-z_]\w*):", text)
        return bool(tops) and 2 * sum(t in sections for t in tops) >= len(tops)
    if not isinstance(data, dict) or not data:
        return False
    keys = set(map(str, data))
    return 2 * len(keys & sections) >= len(keys)  # most of its sections are loraflow's (`model:` alone is not)


def _check_foreign(args: argparse.Namespace, command_line: list[str] | None, framework: str | None,
                   files: list[str]) -> int:
    from loraflow.frontends import run_check
    from loraflow.frontends.versions_source import Dated

    try:
        versions = _foreign_versions(args)
        dated = Dated(args.as_of, {p for p, s in versions.sources.items() if s == _AS_OF.format(args.as_of)}) \
            if args.as_of else None
        text, code = run_check(command_line or None, framework, files, dict(versions.values), args.json, args.data,
                               dated)
        for package, (release, _) in (dated.moved.items() if dated else ()):
            versions.moved(package, release, f"{_AS_OF.format(args.as_of)}, within what the launch uses")
    except LoraflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return CHECK_UNREAD
    if args.json:
        doc = json.loads(text)
        print(json.dumps({"versions_used": versions.describe(), **doc}, indent=2))
    else:
        print(versions.describe())
        print(text)
    return code


_AS_OF = "released by {}"


def _foreign_versions(args: argparse.Namespace):
    """The versions another framework's run used, from the first source that states each (frontends/
    versions_source.py): --versions, --versions-from, --as-of; with none of them, this environment's packages.
    What no source states stays unknown, and each finding then says for which releases it holds."""
    from loraflow.environment import installed_version
    from loraflow.frontends import parse_versions
    from loraflow.frontends.versions_source import PYPI_NAMES, Versions, versions_as_of, versions_from_file

    given = (args.versions or "").strip()
    found = Versions()
    if given and given != "installed":
        found.fill(parse_versions(given), "--versions")
    if args.versions_from:
        found.fill(versions_from_file(args.versions_from), f"--versions-from {args.versions_from}")
    if args.as_of:
        found.fill(versions_as_of(args.as_of), _AS_OF.format(args.as_of))
    if given == "installed" or not (given or args.versions_from or args.as_of):
        installed = {p: v for p, pypi in PYPI_NAMES.items() if (v := installed_version(pypi)) is not None}
        found.fill(installed, "installed here; pass --versions, --versions-from or --as-of for the run's own")
    return found


def check_parser(sub) -> None:
    """`loraflow check`: its flags name the frameworks and releases the frontends declare."""
    c = sub.add_parser("check", help="predict conflicts for a loraflow config or another framework's launch "
                                     "(exit 2 fails as given, 1 depends on what it names, 0 nothing found, 3 "
                                     "input unreadable)",
                       description="loraflow check [CONFIG.yaml] [key=value ...] | loraflow check -- COMMAND LINE | "
                                   "loraflow check TRAIN.py (read, never run) | loraflow check --framework NAME "
                                   "FILE...")
    c.add_argument("items", nargs="*", metavar="CONFIG.yaml | key=value | FILE")
    from loraflow.frontends.base import frameworks, release_names  # as the frontends declare them, never a copy

    c.add_argument("--framework", help="read FILE... as this framework's config "
                                       f"({', '.join(f.name for f in frameworks())})")
    c.add_argument("--versions", metavar="PKG=VER,...", help="the versions the run used, e.g. deepspeed=0.15.3,"
                   f"torch=2.5.1,trl=0.12.2 (frameworks: {', '.join(release_names())}; deepspeed-chat=DATE). "
                   "Another framework's setup is checked over every release of what is not given; `installed` takes "
                   "this machine's. A loraflow config is checked against the installed versions unless given")
    c.add_argument("--versions-from", metavar="FILE", help="read the run's versions from an environment listing: "
                   "`pip freeze`, `pip list`, `conda list`, a requirements file's == pins, or the output of `trl env`, "
                   "`llamafactory-cli env`, `accelerate env`, `transformers env`, `ds_report`")
    c.add_argument("--as-of", metavar="YYYY-MM-DD", help="take the releases current on this date (the day the run "
                   "or its thread was written) for what --versions and --versions-from do not state; where the "
                   "launch's own flags exist only in older (or newer) releases, the newest such release by that date. "
                   "With none of the three, another framework's run is checked against the packages installed here")
    c.add_argument("--data", metavar="FILE", help="another framework's run: its training data (JSON or JSON Lines), "
                   "which decides the rules that depend on the samples (text-only samples mixed with image ones)")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.add_argument("--stage", choices=STAGES, help="check the config as this stage would train it; with no "
                   "config, that stage's built-in demo (default: the config's stage, or sft)")
    c.add_argument("--nproc", type=int, metavar="N", help="plan a loraflow config as launched on N processes "
                   "(torchrun --nproc_per_node N); default: this process's WORLD_SIZE")
    c.set_defaults(func=cmd_check, command_line=None)
