"""The `loraflow` command: train, check, merge, config."""

from __future__ import annotations

import argparse
import json
import sys

from loraflow.errors import LoraflowError

STAGES = ("sft",)


def _split_config_and_overrides(items: list[str]) -> tuple[str | None, list[str]]:
    """`loraflow train sft [CONFIG.yaml] [key=value ...]`: the config is the one argument without `=`."""
    paths = [i for i in items if "=" not in i]
    if len(paths) > 1:
        raise LoraflowError(f"expected one config file, got {len(paths)}: {' '.join(paths)}. Overrides are key=value.")
    return (paths[0] if paths else None), [i for i in items if "=" in i]


def cmd_train(args: argparse.Namespace) -> int:
    from loraflow.run import train

    config_path, overrides = _split_config_and_overrides(args.items)
    summary = train(args.stage, config_path, overrides, args.resume, args.verbose)
    before, after = summary.get("before"), summary.get("after")
    print(f"\nrun directory: {summary['run_dir']}")
    if after:
        for key, value in after.items():
            was = f"{before[key]:.4f} -> " if before and key in before else ""
            print(f"eval {key}: {was}{value:.4f}")
    print(f"trained {summary['steps']} steps in {summary['train_seconds']:.1f}s; weights in {summary['weights']}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from loraflow.config import load_config
    from loraflow.environment import detect_environment
    from loraflow.plan import resolve

    from loraflow.run import demo_config

    config_path, overrides = _split_config_and_overrides(args.items)
    # No config: check the same embedded default that `loraflow train sft` would train.
    plan = resolve(load_config(config_path or demo_config("sft"), overrides), detect_environment())
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.render())
    if plan.errors:
        return 2
    return 1 if plan.warnings else 0


def cmd_merge(args: argparse.Namespace) -> int:
    from loraflow.merge import merge

    out = merge(args.adapter, args.output, args.base)
    print(f"merged model written to {out}")
    return 0


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
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a stage; with no config, the built-in demo")
    t.add_argument("stage", choices=STAGES)
    t.add_argument("items", nargs="*", metavar="CONFIG.yaml | key=value",
                   help="an optional YAML config, then overrides such as train.max_steps=100")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    t.add_argument("-v", "--verbose", action="store_true", help="also print debug lines (eval examples)")
    t.set_defaults(func=cmd_train)

    c = sub.add_parser("check", help="print the plan and rule findings for a config without training "
                                     "(exit 0 clean, 1 warnings, 2 errors)")
    c.add_argument("items", nargs="*", metavar="CONFIG.yaml | key=value")
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=cmd_check)

    m = sub.add_parser("merge", help="merge a saved adapter into its base model and save a plain HF model")
    m.add_argument("adapter", help="adapter directory (adapter_config.json + adapter_model.safetensors)")
    m.add_argument("output", help="directory for the merged model")
    m.add_argument("--base", help="base model path or hub id (default: the one recorded in adapter_config.json)")
    m.set_defaults(func=cmd_merge)

    g = sub.add_parser("config", help="list every config key with its type, default and meaning")
    g.add_argument("--defaults", action="store_true", help="print the default config as YAML instead")
    g.set_defaults(func=cmd_config)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except LoraflowError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; the last complete checkpoint (if any) is intact", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
