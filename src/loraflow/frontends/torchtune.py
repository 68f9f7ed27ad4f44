"""torchtune: `tune run [--nproc_per_node N ...] RECIPE --config CONFIG [key=value ...]`, CONFIG a YAML file or one
of torchtune's built-in configs (`llama3_1/8B_qlora_single_device`), or a torchtune YAML given alone.

The recipe decides the stage, whether an adapter trains and whether FSDP shards the model (torchtune
_recipe_registry.py lists the recipes of each release); the config's model builder decides LoRA, QLoRA
(`qlora_*` builders, `quantize_base`) and DoRA (`use_dora`). A built-in config that is not on this machine is read
by its name (`qlora`, `dora`, `full`, `single_device`) and every shipped config's `dtype: bf16`; what its name does
not say (activation checkpointing) is evaluated both ways. Read at the torchtune tags named beside each fact.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraflow.errors import LoraflowError
from loraflow.frontends import keys
from loraflow.frontends.argv import (
    _TORCHRUN_SWITCHES,
    Command,
    _launcher_options,
    _world_from_launcher,
    resolve_path,
    split_command,
)
from loraflow.frontends.shell import command_from_script
from loraflow.frontends.base import Framework, FrontendResult
from loraflow.frontends.common import Draft, as_bool, at_least, finish_world, load_mapping
from loraflow.frontends.model_types import model_name_facts
from loraflow.frontends.dotlist import flatten, split_overrides
from loraflow.frontends.table import Field, apply_table, fact, stage_of, switch

NAME = "torchtune"


@dataclass(frozen=True)
class Recipe:
    stage: str
    adapter: str
    """lora (an adapter recipe: the config's builder says LoRA, QLoRA or DoRA) or full."""
    distributed: bool
    releases: str = ""
    """The torchtune releases whose recipe registry lists it (torchtune/_recipe_registry.py at each tag)."""


RECIPES = {
    "lora_finetune_single_device": Recipe("sft", "lora", False),
    "lora_finetune_distributed": Recipe("sft", "lora", True),
    "lora_finetune_fsdp2": Recipe("sft", "lora", True, ">=0.2.0,<0.3.0"),  # recipes/dev/ in v0.2.x
    "qat_lora_finetune_distributed": Recipe("sft", "lora", True, ">=0.5.0"),
    "dev/lora_finetune_distributed_multi_dataset": Recipe("sft", "lora", True, ">=0.6.0"),
    "knowledge_distillation_single_device": Recipe("kd", "lora", False, ">=0.3.1"),
    "knowledge_distillation_distributed": Recipe("kd", "lora", True, ">=0.4.0"),
    "full_finetune_single_device": Recipe("sft", "full", False),
    "full_finetune_distributed": Recipe("sft", "full", True),
    "qat_distributed": Recipe("sft", "full", True, ">=0.2.0"),
    "qat_single_device": Recipe("sft", "full", False, ">0.6.1"),
    "dev/early_exit_finetune_distributed": Recipe("sft", "full", True, ">=0.5.0"),
    "lora_dpo_single_device": Recipe("dpo", "lora", False),
    "lora_dpo_distributed": Recipe("dpo", "lora", True, ">=0.2.0"),
    "full_dpo_distributed": Recipe("dpo", "full", True, ">=0.6.0"),
    "ppo_full_finetune_single_device": Recipe("ppo", "full", False, ">=0.3.0"),
    "dev/grpo_full_finetune_distributed": Recipe("grpo", "full", True, ">=0.6.1"),
    "dev/async_grpo_full_finetune_distributed": Recipe("grpo", "full", True, ">0.6.1"),
}
NOT_TRAINING = ("generate", "dev/generate_v2", "dev/generate_v2_distributed", "eleuther_eval", "quantize")
# The distributed recipes shard with FSDP2 (training.shard_model, fully_shard) since v0.3.0; v0.1 - v0.2 wrapped
# with FullyShardedDataParallel (recipes/lora_finetune_distributed.py at v0.2.1).
FSDP2_SINCE = "0.3.0"
FLAGS = {"adapter": "model._component_ (lora_* / qlora_* builders) and the recipe",
         "quantization": "model._component_ qlora_* / model.quantize_base", "checkpointing":
         "enable_activation_checkpointing", "precision": "dtype", "engine": "the recipe (*_distributed: FSDP)",
         "offload": "fsdp_cpu_offload", "packing": "dataset.packed", "world_size": "tune run --nproc_per_node"}


def _recipe(name: str, draft: Draft | None = None) -> tuple[str, Recipe]:
    """A recipe by its registry name or its file (`recipes/lora_finetune_distributed.py`, a copy of one)."""
    key = name.replace("\\", "/").removesuffix(".py")
    key = key.split("recipes/", 1)[-1] if "recipes/" in key else key
    if key in NOT_TRAINING:
        raise LoraflowError(f"`tune run {name}` does not train; loraflow check reads torchtune's training recipes "
                            f"({', '.join(RECIPES)}).")
    if key in RECIPES:
        return key, RECIPES[key]
    stem = Path(key).name
    if stem in RECIPES:
        return stem, RECIPES[stem]
    # A user's modified copy named after the recipe it copies (`first_lora_finetune_distributed.py`,
    # wu-ming233/FIRST-impl): read as that recipe, longest name first, and listed as unseen code (exit 1).
    copied = sorted((r for r in RECIPES if Path(r).name in stem), key=len, reverse=True)
    if copied and name.endswith(".py") and draft is not None:
        draft.unknown.append(f"{name}: the user's own recipe, read as torchtune's {copied[0]} that its name copies; "
                             "its code is not read")
        return copied[0], RECIPES[copied[0]]
    raise LoraflowError(f"`{name}` is not a torchtune training recipe loraflow reads; expected one of "
                        f"{', '.join(RECIPES)} (or a copy of one under the same file name).")


def _builtin(name: str, recipe: Recipe) -> dict[str, tuple[Any, str]]:
    """A built-in config read from its name: the adapter and quantization its name says, and the `dtype: bf16` every
    shipped config sets (recipes/configs/**/*.yaml)."""
    low = name.lower()
    said = f"--config {name} (built-in; read from its name)"
    options: dict[str, tuple[Any, str]] = {"dtype": ("bf16", f"{said}: torchtune's shipped configs set dtype bf16")}
    if recipe.adapter == "lora":
        quantized = bool(re.search(r"q(lora|dora)", low))
        prefix = "qlora_" if quantized else "lora_"
        options["model._component_"] = (prefix + "model", f"{said}: {'QLoRA' if quantized else 'LoRA'}")
        if "dora" in low:
            options["model.use_dora"] = (True, f"{said}: DoRA")
    return options


def _config(cmd_config: str | None, recipe: Recipe, bases: tuple, draft: Draft) -> dict[str, tuple[Any, str]]:
    if not cmd_config:
        raise LoraflowError("tune run needs --config CONFIG (a YAML file or a built-in config name such as "
                            "llama3_1/8B_lora_single_device).")
    # A built-in name is a file under recipes/configs/ of torchtune's tree (what `tune run` resolves it to,
    # torchtune/_recipe_registry.py), here when check runs from a torchtune checkout.
    path = resolve_path(cmd_config, *bases) or resolve_path(f"recipes/configs/{cmd_config.removesuffix('.yaml')}.yaml")
    if path is not None:
        return {k: (v, f"{path.name}: {k}") for k, v in flatten(load_mapping(path, "torchtune config")).items()}
    if cmd_config.endswith((".yaml", ".yml")) or "$" in cmd_config:
        # torchtune's registry names carry no .yaml (torchtune/_recipe_registry.py): a .yaml, or a shell variable,
        # is the user's own file, whose keys are unseen here (seen in users' launches, e.g. wu-ming233/FIRST-impl's
        # `--config ./configs/8B_lora.yaml`).
        draft.unknown.append(f"--config {cmd_config}: not here, so only its name and the command's overrides were "
                             "read (run from the directory the path is relative to)")
    options = _builtin(cmd_config.removesuffix(".yaml"), recipe)
    draft.maybe("checkpointing", {"all": "the config sets enable_activation_checkpointing: True",
                                  "off": "the config leaves activation checkpointing off"},
                f"--config {cmd_config} is not here: whether it checkpoints is in the file")
    return options


def _adapter(draft: Draft, recipe: Recipe, options: dict) -> None:
    def get(key: str, default: Any = None) -> Any:
        return options[key][0] if key in options else default

    component = str(get("model._component_", ""))
    where = options["model._component_"][1] if "model._component_" in options else "the recipe"
    builder = component.rsplit(".", 1)[-1]
    model_name_facts(draft, component, where)  # the builder names the family: torchtune.models.gemma.lora_gemma_7b
    if recipe.adapter == "full":
        draft.set("adapter", "full", f"the recipe trains every weight ({where})")
    else:
        dora = "model.use_dora" in options and as_bool(*options["model.use_dora"])
        draft.set("adapter", "dora" if dora else "lora", options["model.use_dora"][1] if dora else where)
        for key in ("model.lora_attn_modules",):
            if key in options and not options[key][0] and not get("model.apply_lora_to_mlp"):
                draft.set("matched_modules", 0, f"{options[key][1]} (empty, apply_lora_to_mlp off)")
    quant = builder.startswith(("qlora_", "qdora_")) or (
        "model.quantize_base" in options and as_bool(*options["model.quantize_base"]))
    if quant:
        draft.set("quantization", "4bit", options["model.quantize_base"][1] if "model.quantize_base" in options
                  else f"{where} (a QLoRA builder: quantize_base=True)")
        # torchao's NF4Tensor is a tensor subclass FSDP2 shards as it is: no bitsandbytes storage dtype to match
        # (torchtune/modules/low_precision/nf4_linear.py, torchao dtypes/nf4tensor.py fsdp_pre_all_gather).
        draft.set("quant_storage_matches", True, "torchao NF4Tensor weights (torchtune QLoRA), sharded by FSDP2 as "
                  "a tensor subclass")


def _precision(draft: Draft, options: dict) -> None:
    """dtype: the model is built in it and trains in it, no autocast (recipes' training.get_dtype; None: fp32)."""
    value, where = options.get("dtype", (None, "default (torchtune training/precision.py get_dtype: fp32)"))
    dtype = {"bf16": "bf16", "bfloat16": "bf16", "fp32": "fp32", "float32": "fp32", None: "fp32"}.get(
        str(value).lower() if value is not None else None)
    if str(value).lower() in ("fp16", "float16"):
        raise LoraflowError(f"{where}: torchtune's recipes refuse fp16 (`fp16 precision is not supported in this "
                            "recipe`); set dtype to bf16 or fp32.")
    if dtype is None:
        raise LoraflowError(f"{where}: `{value}` is not a torchtune dtype; write bf16 or fp32.")
    draft.set("precision", dtype, where + (" (weights, gradients and optimizer state in bf16)" if dtype == "bf16"
                                           else ""))


def _engine(draft: Draft, name: str, recipe: Recipe) -> None:
    if not recipe.distributed:
        draft.set("engine", "single", f"{name} (one device)")
        draft.set("world_size", 1, f"{name} (one device)")
        return
    if name == "lora_finetune_fsdp2":
        draft.set("engine", "fsdp2", f"{name} shards with fully_shard (recipes/dev/lora_finetune_fsdp2.py)")
        return
    if at_least(draft, "torchtune", FSDP2_SINCE):
        draft.set("engine", "fsdp2", f"{name} shards with fully_shard (training.shard_model, torchtune >= 0.3.0)")
        return
    draft.set("engine", "fsdp1", f"torchtune < 0.3.0 {name} wraps with FullyShardedDataParallel")
    # use_orig_params is left at False, and LoRA's A and B are wrapped as units of their own
    # (utils/_distributed.py lora_fsdp_wrap_policy, v0.1 - v0.2).
    draft.set("fsdp_use_orig_params", False, "torchtune < 0.3.0 FSDP(...) without use_orig_params")
    if recipe.adapter == "lora":
        draft.set("fsdp_frozen_units_separate", True, "torchtune < 0.3.0 lora_fsdp_wrap_policy wraps lora_a/lora_b "
                  "as FSDP units of their own")


def _table(recipe: Recipe) -> tuple[Field, ...]:
    # A built-in config that is not here leaves checkpointing to be evaluated both ways (Draft.maybe): its "all"
    # reading is still the recipes' checkpoint_wrapper, so the facts below hold for it too.
    checkpointed = lambda d: d.get("checkpointing") != "off" or "checkpointing" in d.unsure  # noqa: E731
    return (
        Field("checkpointing", ("enable_activation_checkpointing",), lambda v, w: "all" if as_bool(v, w) else "off"),
        # training.set_activation_checkpointing applies torch's checkpoint_wrapper (CheckpointImpl.NO_REENTRANT) to
        # each decoder layer before shard_model (recipes/*_distributed.py): inside each FSDP2 unit.
        fact("checkpoint_impl", "torch-wrapper", "training.set_activation_checkpointing (torch checkpoint_wrapper)",
             when=checkpointed),
        fact("reentrant", False, "checkpoint_wrapper's CheckpointImpl.NO_REENTRANT (torchtune training/"
             "activations.py)", when=checkpointed),
        fact("checkpoint_outside_shard", False, "checkpointing is applied before shard_model (inside each unit)",
             when=lambda d: checkpointed(d) and d.get("engine") == "fsdp2"),
        Field("offload", ("fsdp_cpu_offload",), switch),
        Field("packing", ("dataset.packed",), switch),
        fact("use_cache", False, "torchtune's models keep no KV cache in training (caches only after setup_caches, "
             "for generation)"),
        fact("forwards_per_step", 1, "concatenated_forward runs chosen and rejected together (recipes/*dpo*.py)",
             when=lambda d: d.get("stage") == "dpo"),
        fact("train_mode_at_backward", True, "the recipes call self._model.train() before the epoch loop"),
        fact("generation", True, "ppo_full_finetune_single_device samples with generation.generate",
             when=lambda d: recipe.stage == "ppo"),
    )


def _eras(draft: Draft, name: str, recipe: Recipe, options: dict) -> None:
    if recipe.releases:
        draft.era("torchtune", recipe.releases, f"recipe {name} is in torchtune's recipe registry {recipe.releases}")
    # Config keys the recipes read only from some release (recipes/lora_finetune_distributed.py at each tag).
    # optimizer_in_bwd dates only the distributed recipes: full_finetune_single_device (and the PPO recipe) read it
    # from v0.1 (`self._optimizer_in_bwd = cfg.optimizer_in_bwd`, recipes/full_finetune_single_device.py).
    for key, spec in (("enable_activation_offloading", ">=0.3.1"), ("fsdp_reshard_after_forward", ">=0.3.0"),
                      ("custom_sharded_layers", ">=0.3.0"), ("optimizer_in_bwd", ">=0.4.0"),
                      ("tensor_parallel_dim", ">=0.6.1"), ("context_parallel_dim", ">0.6.1")):
        if key in options and (recipe.distributed or key != "optimizer_in_bwd"):
            draft.era("torchtune", spec, f"{key} is read by torchtune {spec}")


def _apply(draft: Draft, name: str, recipe: Recipe, options: dict, cmd: Command | None) -> None:
    _eras(draft, name, recipe, options)
    script = cmd is not None and cmd.program_kind == "script"
    draft.set("stage", stage_of(recipe.stage), f"{cmd.program}: torchtune's {name} recipe" if script else
              f"tune run {name}")
    if recipe.stage != stage_of(recipe.stage):
        draft.note(f"{name} is read as stage {stage_of(recipe.stage)} (loraflow's stages are sft, rm, dpo, grpo, "
                   "ppo)")
    _engine(draft, name, recipe)
    _adapter(draft, recipe, options)
    _precision(draft, options)
    apply_table(draft, options, _table(recipe))
    if "enable_activation_offloading" in options and as_bool(*options["enable_activation_offloading"]):
        draft.note(f"{options['enable_activation_offloading'][1]}: checkpointed activations are offloaded to CPU "
                   "(training.get_act_offloading_ctx_manager)")
    if recipe.stage == "grpo":
        draft.note("the dev GRPO recipes generate through the model's own forward (FSDP2's hooks run at each step): "
                   "not read as generate()")
    draft.flag(**FLAGS)
    finish_world(draft, cmd)


def _run_line(cmd: Command, draft: Draft) -> tuple[str, Recipe, str | None, list, list[str]]:
    """`tune run [torchrun options] RECIPE --config CONFIG [key=value ...]`, or a recipe run as a script
    (`torchrun [options] recipes/RECIPE.py --config CONFIG ...`): the recipe, the config, the overrides and any other
    token; the torchrun options become the launcher's (world size)."""
    script = recipe_script(cmd.program) if cmd.program_kind == "script" else None
    if script:
        return (script, RECIPES[script]) + _recipe_args(cmd.args)
    if cmd.subcommand != "run":
        raise LoraflowError(f"`tune {cmd.subcommand or ' '.join(cmd.args[:1])}` does not train; loraflow check "
                            "reads `tune run RECIPE --config CONFIG [key=value ...]`.")
    # `tune run`'s own options are torchrun's (torchtune/_cli/run.py hands them to torch.distributed.run).
    launch, index = _launcher_options(cmd.args, _TORCHRUN_SWITCHES)
    if index >= len(cmd.args):
        raise LoraflowError("tune run: no recipe given; expected `tune run RECIPE --config CONFIG`.")
    name, recipe = _recipe(cmd.args[index], draft)
    cmd.launcher, cmd.launcher_args = "torchrun", launch
    _world_from_launcher(cmd)
    return (name, recipe) + _recipe_args(cmd.args[index + 1:])


def _recipe_args(args: list[str]) -> tuple[str | None, list, list[str]]:
    """A recipe's arguments: `--config CONFIG` (or `-c`), the `key=value` overrides, and any other token."""
    overrides, others = split_overrides(args)
    config, rest = None, []
    i = 0
    while i < len(others):
        flag, eq, value = others[i].partition("=")
        if flag in ("--config", "-c"):
            config, i = (value, i + 1) if eq else (others[i + 1] if i + 1 < len(others) else None, i + 2)
            continue
        rest.append(others[i])
        i += 1
    return config, overrides, rest


def recipe_script(program: str) -> str | None:
    """The registry name of a torchtune recipe launched as a script from a clone of the repository
    (`recipes/lora_finetune_distributed.py`, `torchtune/recipes/dev/grpo_full_finetune_distributed.py`): every
    recipe parses `--config` and `key=value` overrides itself (torchtune config/_parse.py), so it reads as `tune run`
    does. None for any other program."""
    path = program.replace("\\", "/").removesuffix(".py")
    if "recipes/" not in f"/{path}":
        return None
    name = f"/{path}".rsplit("/recipes/", 1)[-1]
    return name if name in RECIPES else None


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    name, recipe, config, overrides, rest = _run_line(cmd, draft)
    options = _config(config, recipe, (), draft)
    for o in overrides:
        if o.mode == "~":
            options.pop(o.key, None)
        else:
            options[o.key] = (o.value, o.raw)
    draft.unknown += [f"{t} (not a `key=value` override)" for t in rest]
    _unknown(draft, options)
    _apply(draft, name, recipe, options, cmd)
    return draft.result()


_LAUNCH_IN_COMMENT = re.compile(r"^#[\s#]*(tune run .*?)\s*$", re.M)


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """A launch script (.sh), or a torchtune config YAML alone: its recipe is the `tune run` line torchtune's configs
    carry in their header comment; without one, read from the model builder (LoRA or full) on one device."""
    if len(paths) != 1:
        raise LoraflowError("--framework torchtune takes one file: a torchtune config YAML or a launch script (.sh); "
                            "or give `tune run ...` after `--`.")
    path = Path(paths[0])
    if path.suffix == ".sh":
        return from_command(split_command(command_from_script(str(path))), versions)
    data = load_mapping(path, "torchtune config")
    text = path.read_text(encoding="utf-8", errors="replace")
    options = {k: (v, f"{path.name}: {k}") for k, v in flatten(data).items()}
    if "model._component_" not in options:
        raise LoraflowError(f"{path}: no model._component_ key, so not a torchtune config (torchtune configs name "
                            "their model builder there, e.g. torchtune.models.llama3.lora_llama3_8b).")
    draft = Draft(NAME, versions)
    _unknown(draft, options)
    launch = _LAUNCH_IN_COMMENT.search(text)
    cmd: Command | None = None
    if launch:
        cmd = split_command(launch.group(1).split())
        name, recipe = _run_line(cmd, draft)[:2]
        draft.note(f"{path.name}: recipe read from its header comment `{launch.group(1)}`")
    else:
        name, recipe = _recipe_without_launch(path.name, text, options, draft)
    if recipe.distributed and cmd is None:
        draft.maybe("world_size", {1: "launched on one process", 2: "launched on several processes"},
                    f"{path.name} is for {name}, and no `tune run --nproc_per_node N` line says on how many")
    _apply(draft, name, recipe, options, cmd)
    return draft.result()


# torchtune's configs open with `# Config for ... in RECIPE.py` (recipes/configs/**/*.yaml); some, such as the
# multi-node ones launched from a SLURM script (llama3_3/70B_full_multinode.yaml), carry no `tune run` line.
_RECIPE_IN_HEADER = re.compile(r"^#\s*Config for .*? (?:in|with) ([\w/]+)\.py\b", re.M)  # `QLoRA with X.py` too
# Keys only the distributed recipes read (recipes/*_distributed.py): a config with them is for one of those.
_DISTRIBUTED_KEYS = ("fsdp_cpu_offload", "custom_sharded_layers", "fsdp_reshard_after_forward", "tensor_parallel_dim",
                     "context_parallel_dim", "data_parallel_shard_dim", "data_parallel_replicate_dim")


def _recipe_without_launch(file: str, text: str, options: dict, draft: Draft) -> tuple[str, Recipe]:
    """The recipe of a config with no `tune run` line: the one its header comment names, else the builder's kind
    (LoRA or full), distributed where the config sets a key only the distributed recipes read."""
    header = _RECIPE_IN_HEADER.search(text)
    named = header.group(1) if header else None
    if named and (named in RECIPES or Path(named).name in RECIPES):
        draft.note(f"{file}: recipe read from its header comment `{header.group(0).lstrip('# ')}`")
        return _recipe(named)
    builder = str(options["model._component_"][0]).rsplit(".", 1)[-1]
    kind = "lora" if "lora" in builder or "dora" in builder else "full"
    sharded = [k for k in _DISTRIBUTED_KEYS if k in options]
    name, recipe = _recipe(f"{kind}_finetune_{'distributed' if sharded else 'single_device'}")
    draft.note(f"{file} names no recipe: read as {name}" + (f" ({sharded[0]} is read only by the distributed "
               "recipes)" if sharded else "") + f" (pass `tune run RECIPE --config {file}` after `--` for another)")
    return name, recipe


def _unknown(draft: Draft, options: dict) -> None:
    """Keys whose top level no torchtune config or recipe has (keys.TORCHTUNE); those below a component are its
    builder's arguments. A top-level key the config only names in `${...}` (`model_dir: /tmp/x` beside
    `checkpoint_dir: ${model_dir}`) is a variable of the file's own for OmegaConf to interpolate (torchtune's
    config/_parse.py loads with OmegaConf), not a setting a recipe reads."""
    referenced = {m.group(1) for value, _ in options.values() for m in _INTERPOLATION.finditer(str(value))}
    for key, (value, where) in options.items():
        if key.split(".", 1)[0] not in keys.TORCHTUNE and key not in referenced:
            draft.unknown.append(where)


_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def _recognise(view) -> bool:
    return view.cli == "tune" or (view.cli is None and recipe_script(view.program) is not None
                                  and "config" in view.flags)


FRAMEWORK = Framework(name=NAME, title="torchtune", module="torchtune", recognise=_recognise, flags=FLAGS,
                      log_paths=r"torchtune[/\\]|recipes[/\\](lora|full)_finetune", dated=True,
                      file_markers=frozenset({"checkpointer"}))  # every torchtune config names its checkpointer
