"""The `loraflow` command: train, check, explain, probe, merge, generate, chat, plot, config."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from loraflow.commands.check import CHECK_UNREAD, check_parser, split_config_and_overrides
from loraflow.errors import LoraflowError
from loraflow.stagespec import STAGE_NAMES as STAGES
from loraflow.stagespec import stage_spec


def cmd_train(args: argparse.Namespace) -> int:
    from loraflow.run.train import train

    config_path, overrides = split_config_and_overrides(args.items)
    if args.resume and args.restart:
        raise LoraflowError("--resume continues a run from its checkpoint and --restart starts one again from "
                            "step 0; give one of them.")
    if args.extend and not args.resume:
        raise LoraflowError("--extend lengthens a run being resumed: give --resume RUN_DIR and train.max_steps=N "
                            "(a new run takes its length from train.max_steps alone).")
    summary = train(args.stage, config_path, overrides, args.resume, args.verbose, args.restart, args.extend)
    if not summary.get("main", True):
        return 0  # rank 0 prints the summary of a distributed run
    before, after = summary.get("before"), summary.get("after")
    print(f"\nrun directory: {summary['run_dir']}")
    if after:
        for key, value in after.items():
            was = f"{before[key]:.4f} -> " if before and key in before else ""
            print(f"eval {key}: {was}{value:.4f}")
    print(f"trained {summary['steps']} steps in {summary['train_seconds']:.1f}s; weights in {summary['weights']}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from loraflow.explain import (
        as_dict,
        diagnose_log,
        explained,
        list_signatures,
        read_log,
        render,
    )
    from loraflow.frontends import launch_builder

    if args.list:
        print(list_signatures())
        return 0
    if not args.log:
        raise LoraflowError("explain: pass a log file, or `-` to read the log from stdin (or --list).")
    text = read_log(args.log)
    launch = launch_builder(args.launch, args.framework) if args.launch else None
    log, candidates, framework = diagnose_log(text, launch)
    if args.json:
        print(json.dumps(as_dict(candidates, framework, log.versions, log, args.log), indent=2))
    else:
        print(render(candidates, framework, log.versions, log, args.log))
    return 0 if explained(log, candidates) else 1


def cmd_probe(args: argparse.Namespace) -> int:
    from loraflow.environment import detect_environment
    from loraflow.probes import all_cases
    from loraflow.probes.report import render_table
    from loraflow.probes.runner import run_probes

    if args.list:
        for rule_id, case in all_cases().items():
            print(f"{rule_id} ({case.ranks} rank{'s' if case.ranks > 1 else ''}): {case.what}")
        return 0
    only = [r.strip() for item in args.only or [] for r in item.split(",") if r.strip()]
    if args.only is not None and not only:
        raise LoraflowError("probe --only: no rule id given; `loraflow probe --list` shows them.")
    env = detect_environment()
    versions = ", ".join(f"{k} {v}" for k, v in env.versions.items() if v) + f" ({env.device})"
    progress = None if args.json else (lambda rule: print(f"probing {rule} ...", file=sys.stderr, flush=True))
    results = run_probes(only, args.logs, progress)
    if args.json:
        print(json.dumps({"versions": versions, "results": [r.to_dict() for r in results]}, indent=2))
    else:
        print(render_table(results, versions))
    unsafe = [r for r in results if r.safe == "no" or "failed" in (r.affected, r.safe)]
    return 2 if unsafe else 0


def cmd_merge(args: argparse.Namespace) -> int:
    from loraflow.commands.merge import merge

    print(merge(args.adapter, args.output, args.base, args.dtype).render())
    return 0


def _load_for_generation(args: argparse.Namespace):
    import transformers

    from loraflow.commands.generate import Sampling, load

    # Loading bars and per-call deprecation warnings would interleave with the answers.
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    sampling = Sampling(args.max_new_tokens, args.temperature, args.top_p, args.seed)
    sampling.check()  # before the model loads: a bad flag should fail in a second
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        loaded = load(args.target, args.base)
    # stderr: stdout carries only the answers (--json stays one object per line).
    print(f"loaded {loaded.source} on {loaded.device}", file=sys.stderr)
    for note in loaded.notes:
        print(f"note: {note}", file=sys.stderr)
    return loaded, sampling


def cmd_generate(args: argparse.Namespace) -> int:
    from loraflow.commands.generate import Prompt, generate, read_prompts

    if args.image and args.prompt is None:
        raise LoraflowError("--image goes with --prompt TEXT (the question about the image). In a --prompts file, "
                            "put image parts in each record's messages: {\"type\": \"image\", \"path\": ...}.")
    if (args.prompt is None) == (args.prompts is None):
        raise LoraflowError("generate: give exactly one of --prompt TEXT or --prompts FILE.")
    if args.image:  # opened here: a missing or broken file fails before the model loads
        from loraflow.commands.vision import image_prompt

        prompts = [image_prompt(args.prompt, args.image)]
    else:
        prompts = [Prompt(None, args.prompt)] if args.prompt is not None else read_prompts(args.prompts)
    loaded, sampling = _load_for_generation(args)
    generate(loaded, prompts, sampling, chat_template=not args.no_chat_template, as_json=args.json)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    from loraflow.commands.generate import chat

    loaded, sampling = _load_for_generation(args)
    chat(loaded, sampling)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from loraflow.commands.plot import plot_runs

    for path in plot_runs(args.runs, args.output):
        print(path)
    return 0


def version_text() -> str:
    import importlib.metadata
    import platform

    from loraflow import __version__

    lines = [f"loraflow {__version__}", f"python {platform.python_version()}"]
    for package in ("torch", "transformers", "peft", "deepspeed"):
        try:
            lines.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"{package} not installed")
    return "\n".join(lines)


class _VersionAction(argparse.Action):
    """`--version` before any subcommand (the subcommand is otherwise required)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def _generation_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="RUN_DIR_OR_ADAPTER",
                        help="a run directory (config.yaml + adapter/ or model/), an adapter directory or a model")
    parser.add_argument("--base", help="base model path, hub id or builtin:NAME (default: the run's model.path, or "
                                       "the one recorded in adapter_config.json)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="generation budget per answer (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature; 0 (the default) is "
                                                                       "greedy decoding")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: sample from the smallest set of "
                                                                 "tokens holding this probability (with --temperature)")
    parser.add_argument("--seed", type=int, default=0, help="seed of sampling (default 0)")


def cmd_config(args: argparse.Namespace) -> int:
    from loraflow.config import Config, dump_config
    from loraflow.config.docs import field_table

    if args.defaults:
        print(dump_config(Config()), end="")
        return 0
    for key, tp, default, doc in field_table():
        print(f"{key}  ({tp}; default {default!r})\n    {doc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="loraflow", description=__doc__)
    # The deepspeed launcher passes --local_rank=N before the arguments; LOCAL_RANK in the environment says the same.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--version", action=_VersionAction, help="print the versions of loraflow, torch, transformers, "
                                                            "peft and deepspeed, then exit")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a stage; with no config, the built-in demo")
    t.add_argument("stage", choices=STAGES, help="; ".join(f"{n}: {stage_spec(n).summary}" for n in STAGES))
    t.add_argument("items", nargs="*", metavar="CONFIG.yaml | key=value",
                   help="an optional YAML config, then overrides such as train.max_steps=100")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    t.add_argument("--restart", metavar="RUN_DIR", help="start the run in RUN_DIR again from step 0 with its saved "
                   "config (and any overrides): for a run that stopped before writing a checkpoint; its earlier "
                   "files move to RUN_DIR/earlier-attempts/N")
    t.add_argument("--extend", action="store_true", help="with --resume and another train.max_steps=N (usually "
                   "larger): continue to N steps on the learning-rate schedule rebuilt for N, as if N had been asked "
                   "from the start (without it, changing train.max_steps on resume is refused)")
    t.add_argument("-v", "--verbose", action="store_true", help="also print debug lines (eval examples)")
    t.set_defaults(func=cmd_train)

    check_parser(sub)

    e = sub.add_parser("explain", help="say what broke in a failed run's log, why, and how to fix it "
                                       "(exit 0 explained, 1 nothing matched, 2 unreadable input)")
    e.add_argument("log", nargs="?", metavar="LOGFILE", help="the log file, or - for stdin")
    e.add_argument("--list", action="store_true", help="list the failure signatures loraflow knows")
    e.add_argument("--json", action="store_true", help="machine-readable output")
    e.add_argument("--launch", metavar="FILE", help="the run's launch script (.sh) or config: the conflicts it sets "
                   "up (as `loraflow check` reads it) rank the log's causes")
    e.add_argument("--framework", metavar="NAME", help="the framework of the --launch config (default: guessed "
                   "from its keys)")
    e.set_defaults(func=cmd_explain)

    pr = sub.add_parser("probe", help="run tiny live reproductions of the rules on the installed stack "
                                      "(exit 2 if loraflow's plan was unsafe anywhere)")
    pr.add_argument("--only", action="append", metavar="ID", help="probe only this rule id (repeat or comma-separate)")
    pr.add_argument("--logs", metavar="DIR", help="keep each probe's full output in DIR")
    pr.add_argument("--list", action="store_true", help="list the probes without running them")
    pr.add_argument("--json", action="store_true", help="machine-readable output")
    pr.set_defaults(func=cmd_probe)

    m = sub.add_parser("merge", help="merge a saved adapter into its base model and save a plain HF model")
    m.add_argument("adapter", help="adapter directory (adapter_config.json + adapter_model.safetensors)")
    m.add_argument("output", help="directory for the merged model")
    m.add_argument("--base", help="base model path or hub id (default: the one recorded in adapter_config.json)")
    m.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="dtype a quantized (QLoRA) base is dequantized into before merging (default float32)")
    m.set_defaults(func=cmd_merge)

    gen = sub.add_parser("generate", help="answer prompts with a trained run, adapter or model",
                         description="loraflow generate RUN_DIR_OR_ADAPTER (--prompt TEXT [--image PATH ...] | "
                                     "--prompts FILE)")
    _generation_flags(gen)
    gen.add_argument("--prompt", help="one prompt, sent as the user's turn of the chat template")
    gen.add_argument("--image", metavar="PATH", action="append", help="an image sent with --prompt, before its text "
                     "(image-text runs); repeat it for several images")
    gen.add_argument("--prompts", metavar="FILE", help="a .txt file (one prompt per line) or .jsonl file (`prompt` or "
                                                       "`messages` per line; messages may hold image parts)")
    gen.add_argument("--no-chat-template", action="store_true", help="tokenize prompts as plain text instead of "
                                                                     "wrapping them in the chat template")
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt and line")
    gen.set_defaults(func=cmd_generate)

    ch = sub.add_parser("chat", help="talk to a trained run, adapter or model (reads stdin lines; /image PATH, "
                                     "/reset, /exit)")
    _generation_flags(ch)
    ch.set_defaults(func=cmd_chat)

    pl = sub.add_parser("plot", help="draw the loss, learning rate, grad norm, eval and reward curves of runs as PNGs")
    pl.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories; several are overlaid")
    pl.add_argument("-o", "--output", metavar="OUT_DIR", help="where the PNGs go (default RUN_DIR/plots for one "
                                                              "run; required for several)")
    pl.set_defaults(func=cmd_plot)

    g = sub.add_parser("config", help="list every config key with its type, default and meaning")
    g.add_argument("--defaults", action="store_true", help="print the default config as YAML instead")
    g.set_defaults(func=cmd_config)
    return p


RUNS_MODELS = ("train", "probe", "merge", "generate", "chat")
"""Commands that build models on the installed stack, so refuse one older than pyproject.toml declares. check,
explain, plot and config read files and version numbers, and stay usable on any stack."""


def main(argv: list[str] | None = None) -> int:
    from loraflow.run.log import hold_other_packages_logs

    hold_other_packages_logs()  # before any other package is imported: their import-time notices stay off the console
    argv = list(sys.argv[1:] if argv is None else argv)
    command_line = None
    if argv[:1] == ["check"] and "--" in argv:
        # `loraflow check [--json] [--versions ...] -- <another framework's command line>`
        cut = argv.index("--")
        argv, command_line = argv[:cut], argv[cut + 1:]
        if not command_line:
            print("error: nothing after `--`; give the launch command line to check", file=sys.stderr)
            return CHECK_UNREAD
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra and args.command == "train" and all("=" in e and not e.startswith("-") for e in extra):
            args.items += extra  # `train sft --resume DIR key=value`: argparse stops the positional list at --resume
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as exc:  # argparse's usage error is 2, which check keeps for "this launch fails"
        if argv[:1] == ["check"] and exc.code == 2:
            return CHECK_UNREAD
        raise
    if command_line is not None:
        args.command_line = command_line
    try:
        if args.command in RUNS_MODELS:
            from loraflow.environment import require_floors

            require_floors()
        return args.func(args)
    except LoraflowError as exc:
        # A run stopped by a signal: 128 + its number, as a shell reports it. check keeps 2 for a config, data or
        # plan train would refuse; what it could not read at all (a bad flag of its own, say) is no verdict.
        unread = args.command == "check" and type(exc) is LoraflowError
        code = getattr(exc, "exit_code", CHECK_UNREAD if unread else 2)
        print(exc if code not in (2, CHECK_UNREAD) else f"error: {exc}", file=sys.stderr)
        return code
    except BrokenPipeError:  # output piped into `head`: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("interrupted; the last complete checkpoint (if any) is intact", file=sys.stderr)
        return 130
    except Exception:  # a bug, not bad input: keep the traceback, and never exit 1 (which means "warnings")
        import traceback

        traceback.print_exc()
        print(f"error: loraflow {args.command} failed unexpectedly (a bug; please report it with the traceback "
              "above)", file=sys.stderr)
        return CHECK_UNREAD if args.command == "check" else 2


if __name__ == "__main__":
    sys.exit(main())
