"""Lightning's Trainer and Fabric in a training script (`lightning`, `pytorch_lightning`, `lightning_fabric`): the
loop, the processes, the precision and the sharding come from `Trainer(...)` / `Fabric(...)`, not from
TrainingArguments, so the HF Trainer's defaults must not apply (its find_unused_parameters=True for a PeftModel, its
use_cache=False). The model, its adapters, quantization and checkpointing are still read from the code
(script_facts.py), and a DeepSpeed strategy becomes the DeepSpeed config hf.py reads for any run.

What the arguments mean, read at Lightning 2.x (src/lightning/...; 1.x spelled the same strings):
- precision (fabric/plugins/precision/precision.py): 16 / "16" -> "16-mixed", "bf16" -> "bf16-mixed", 32 / "32" ->
  "32-true"; "*-true" casts every weight, adapters included, to that dtype (HalfPrecision, no loss scaler).
- strategy (pytorch/strategies/ddp.py, deepspeed.py, fsdp.py register_strategies): "ddp" and its spawn/fork variants
  pass torch's DDP defaults (find_unused_parameters=False) unless the name ends in `_find_unused_parameters_true`;
  "deepspeed" is ZeRO stage 2, "deepspeed_stage_{1,2,3}[_offload[_nvme]]" name stage and offload; "fsdp" and
  "fsdp_cpu_offload" are FSDP1 with use_orig_params=True, one unit for the whole model unless auto_wrap_policy is
  given, and activation_checkpointing_policy wraps blocks in torch's checkpoint_wrapper (NO_REENTRANT).
- DeepSpeed precision (fabric/strategies/deepspeed.py _format_precision_config): 16-mixed / 16-true enable DeepSpeed's
  fp16 (the weights cast to float16, dynamic loss scale), bf16-mixed / bf16-true its bf16.
- devices x num_nodes processes, which Lightning starts itself: `python train.py` is a multi-process run.
"""

from __future__ import annotations

from typing import Any

from loraflow.frontends.common import Draft
from loraflow.frontends.hf_options import Opt
from loraflow.frontends.script_code import Call, Code

PACKAGES = ("lightning", "pytorch_lightning", "lightning_fabric")
CLASSES = ("Trainer", "Fabric")
ALIASES = {"16": "16-mixed", "bf16": "bf16-mixed", "32": "32-true", "64": "64-true"}
PRECISIONS = {"16-mixed": "fp16-mixed", "bf16-mixed": "bf16-mixed", "16-true": "fp16", "bf16-true": "bf16",
              "32-true": "fp32", "64-true": "fp32"}
DEEPSPEED = {"deepspeed": (2, False, False), "deepspeed_stage_1": (1, False, False),
             "deepspeed_stage_2": (2, False, False), "deepspeed_stage_2_offload": (2, True, False),
             "deepspeed_stage_3": (3, False, False), "deepspeed_stage_3_offload": (3, True, True),
             "deepspeed_stage_3_offload_nvme": (3, True, True)}
"""Registered DeepSpeed strategy names -> (ZeRO stage, optimizer offloaded, parameters offloaded)."""
DDP = ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")
FLAGS = {"precision": "Trainer(precision=...) (16-mixed, bf16-mixed, 16-true, bf16-true, 32-true)",
         "engine": "Trainer(strategy=...) (ddp, deepspeed_stage_2, deepspeed_stage_3, fsdp)",
         "zero_stage": "Trainer(strategy=DeepSpeedStrategy(stage=...))",
         "offload": "Trainer(strategy=DeepSpeedStrategy(offload_optimizer=..., offload_parameters=...))",
         "find_unused_parameters": "Trainer(strategy=...) (ddp, ddp_find_unused_parameters_true) or "
                                   "DDPStrategy(find_unused_parameters=...)",
         "ddp_static_graph": "DDPStrategy(static_graph=True)",
         "world_size": "Trainer(devices=..., num_nodes=...)",
         "fsdp_use_orig_params": "FSDPStrategy(use_orig_params=...)"}


def is_loop(call: Call, code: Code) -> bool:
    """`Trainer(...)`, `L.Trainer(...)`, `pl.Trainer(...)`, `Fabric(...)` of a Lightning package."""
    if call.name not in CLASSES:
        return False
    root = call.func.split(".", 1)[0]
    return code.imports.get(root if call.owner_name else call.name) in PACKAGES


def precision_of(call: Call) -> tuple[str | None, str]:
    """Lightning's unified precision string and where it was read; (None, why) for a value that is not literal."""
    value = call.kwargs.get("precision", "32-true")
    where = call.at("precision") if "precision" in call.kwargs else f"default ({call.at()}: precision='32-true')"
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None, f"{call.at('precision')} (not a literal: the precision is not visible)"
    text = ALIASES.get(str(value), str(value))
    return (text, where) if text in PRECISIONS else (None, f"{call.at('precision')} (`{value}`: not a precision "
                                                           f"check reads: {', '.join(PRECISIONS)})")


def options(call: Call) -> dict[str, Opt]:
    """The HF options the Trainer's arguments stand for: mixed precision, a DeepSpeed config, accumulation."""
    opts: dict[str, Opt] = {}
    precision, where = precision_of(call)
    deepspeed = _deepspeed(call.kwargs.get("strategy"), call)
    if precision in ("16-mixed", "bf16-mixed") or (deepspeed and precision in ("16-true", "bf16-true")):
        opts["bf16" if precision.startswith("bf16") else "fp16"] = Opt(True, where, True)
    if deepspeed is not None:
        config, source = deepspeed
        if precision in ("16-mixed", "16-true"):
            config.setdefault("fp16", {"enabled": True, "loss_scale": 0})
        elif precision in ("bf16-mixed", "bf16-true"):
            config.setdefault("bf16", {"enabled": True})
        opts["deepspeed"] = Opt(config, source, True)
    plugin = bnb_plugin(call)
    if plugin is not None:
        mode = plugin.arg(0, "mode")
        # "int8-training" keeps fp16 weights that train (bnb Linear8bitLt has_fp16_weights=True): not a frozen base.
        bits = None if not isinstance(mode, str) or mode == "int8-training" else "8bit" if mode == "int8" else "4bit"
        if bits is not None:
            opts[f"load_in_{bits}"] = Opt(True, f"{plugin.at('mode' if 'mode' in plugin.kwargs else None)} (Lightning "
                                      "replaces the model's nn.Linear layers with bitsandbytes ones)", True)
    steps = call.kwargs.get("accumulate_grad_batches")
    if isinstance(steps, int) and not isinstance(steps, bool):
        opts["gradient_accumulation_steps"] = Opt(steps, call.at("accumulate_grad_batches"), True)
    return opts


def bnb_plugin(call: Call) -> Call | None:
    """Trainer(plugins=BitsandbytesPrecision(mode=...)) (or in a list of plugins): Lightning's own quantization."""
    plugins = call.kwargs.get("plugins")
    for plugin in plugins if isinstance(plugins, list) else [plugins]:
        if isinstance(plugin, Call) and plugin.name == "BitsandbytesPrecision":
            return plugin
    return None


def _bnb_adapters(draft: Draft, call: Call, loads: list[Call]) -> None:
    """BitsandbytesPrecision.convert_module replaces every torch.nn.Linear under the module not named in
    ignore_modules (fabric/plugins/precision/bitsandbytes.py _convert_layers), and PEFT's lora_A / lora_B are
    nn.Linear layers: a PeftModel built before the Trainer sets it up gets frozen 4-/8-bit adapters, and nothing
    trains. It converts only a module that holds no bitsandbytes layer yet (`if not any(isinstance(m,
    (bnb.nn.Linear8bitLt, bnb.nn.Linear4bit)) ...)`): a model from_pretrained already quantized keeps its adapters."""
    plugin = bnb_plugin(call)
    if plugin is None or draft.get("adapter") == "full" or plugin.arg(0, "mode") == "int8-training":
        return
    quantized = next((c for c in loads for k in ("quantization_config", "load_in_4bit", "load_in_8bit")
                      if c.kwargs.get(k) not in (None, False)), None)
    if quantized is not None:
        draft.note(f"{plugin.at()}: {quantized.at()} loads the model already quantized by bitsandbytes, so "
                   "Lightning's convert_module replaces no layer (PEFT's lora_A / lora_B stay trainable)")
        return
    where = f"{plugin.at()}: Lightning converts every nn.Linear, PEFT's lora_A / lora_B included, to bitsandbytes " \
            "layers whose weights do not require grad (fabric/plugins/precision/bitsandbytes.py)"
    if "ignore_modules" in plugin.kwargs:
        draft.maybe("adapter_loaded_frozen", {True: "ignore_modules does not cover the LoRA layers",
                                              False: "ignore_modules keeps the LoRA layers in float"},
                    f"{plugin.at('ignore_modules')}: matched by module-name prefix")
    else:
        draft.set("adapter_loaded_frozen", True, where)


def _deepspeed(strategy: Any, call: Call) -> tuple[dict, str] | None:
    """A DeepSpeed strategy as the config Lightning builds for it (_create_default_config)."""
    if isinstance(strategy, str) and strategy in DEEPSPEED:
        stage, optimizer, params = DEEPSPEED[strategy]
        source = call.at("strategy")
    elif isinstance(strategy, Call) and strategy.name == "DeepSpeedStrategy":
        config = strategy.kwargs.get("config")
        if isinstance(config, (str, dict)):
            return (config if isinstance(config, str) else dict(config)), strategy.at("config")
        stage = strategy.kwargs.get("stage", 2)
        optimizer = strategy.kwargs.get("offload_optimizer") is True
        params = strategy.kwargs.get("offload_parameters") is True
        source = strategy.at("stage" if "stage" in strategy.kwargs else None)
        if not isinstance(stage, int):
            stage = 2
    else:
        return None
    zero: dict[str, Any] = {"stage": stage}
    if optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if params:
        zero["offload_param"] = {"device": "cpu"}
    return {"zero_optimization": zero}, source


def apply(draft: Draft, facts: Any, code_saves: list[Call]) -> None:
    """After hf.py read the translated options: what Lightning decides that the HF Trainer decides otherwise.
    `facts`: the script's (script_facts.Facts); `code_saves`: its save_pretrained calls on a model."""
    call = facts.lightning
    if facts.gc is not None and draft.get("checkpoint_impl") == "transformers":
        draft.set("checkpoint_impl", "transformers", f"{facts.gc.at()} (transformers' own checkpointing)")
    draft.set("stage", "sft", f"{call.at()} (Lightning runs the LightningModule's training_step)")
    draft.set("train_mode_at_backward", True, f"{call.at()}: Lightning's fit loop calls model.train()")
    if "use_cache" not in facts.opts:
        draft.set("use_cache", True, "default (the model config's use_cache=True: Lightning leaves it as loaded)")
    _world(draft, call)
    _bnb_adapters(draft, call, facts.loads)
    strategy = call.kwargs.get("strategy")
    precision, where = precision_of(call)
    if precision is None:
        draft.unknown.append(where)
    elif draft.get("engine") != "deepspeed":
        draft.set("precision", PRECISIONS[precision], where)
        if precision in ("16-true", "bf16-true"):
            draft.set("mixed_param_dtypes", False, f"{where}: Lightning casts every weight to one dtype")
        if precision == "16-true":
            draft.set("grad_scaler", False, f"{where}: true half precision scales no loss")
    _sharded_facts(draft, code_saves)
    _configure_model_load(draft, facts.loads)
    if _fsdp(draft, strategy, call):
        return
    unused, static = _ddp(strategy)
    if draft.get("engine") != "deepspeed":
        draft.set("find_unused_parameters", unused[0],
                  call.at("strategy") if unused[1] else f"default ({call.at()}: Lightning's DDPStrategy passes torch's "
                                                        "find_unused_parameters=False)")
        if static:
            draft.set("ddp_static_graph", True, call.at("strategy"))
    if isinstance(strategy, str) and strategy not in (*DDP, *DEEPSPEED, "auto", "fsdp", "fsdp_cpu_offload") and \
            not strategy.startswith(DDP):
        draft.unknown.append(f"{call.at('strategy')} (`{strategy}`: a strategy check does not read)")


def _sharded_facts(draft: Draft, saves: list[Call]) -> None:
    """What the HF Trainer's ZeRO-3 path sets that Lightning's does not: Lightning calls deepspeed.initialize on the
    model the module built (zero.Init only inside configure_model), and DeepSpeed's fp16/bf16 engine casts the whole
    module, adapters included, to that dtype; Lightning saves DeepSpeed's sharded checkpoint, so only the script's own
    save_pretrained writes an adapter file, and under ZeRO-3 it gathers nothing."""
    if draft.get("engine") != "deepspeed" or draft.get("zero_stage") != 3:
        return
    if draft.get("quantization") is None and draft.get("precision") != "fp32":
        draft.set("mixed_param_dtypes", False, "DeepSpeed's fp16/bf16 engine casts the whole module to one dtype "
                  "(Lightning builds no zero.Init model outside configure_model)")
    if saves:
        draft.set("adapter_save_gather", False, f"{saves[0].at()} under ZeRO-3 (Lightning's own checkpoint is "
                  "DeepSpeed's sharded one; nothing gathers the adapters for save_pretrained)")
    else:
        draft.set("adapter_save_gather", True, "no save_pretrained in the code: Lightning saves DeepSpeed's sharded "
                  "checkpoint, which holds the adapters")


def _configure_model_load(draft: Draft, loads: list[Call]) -> None:
    """ZeRO-3 runs LightningModule.configure_model inside deepspeed.zero.Init (strategy.model_sharded_context,
    pytorch/strategies/deepspeed.py), which transformers does not know of (no HfDeepSpeedConfig): from_pretrained
    there builds every weight as a [0] partition and then copies the checkpoint into it, which stops at the load
    (`size mismatch ... the shape in current model is torch.Size([0])`, Lightning-AI/pytorch-lightning#19259)."""
    if draft.get("engine") != "deepspeed" or draft.get("zero_stage") != 3:
        return
    for load in loads:
        if load.scope in ("configure_model", "configure_sharded_model") and load.name == "from_pretrained":
            draft.stop(f"{load.at()} inside {load.scope} under ZeRO-3: Lightning runs it in deepspeed's "
                       "zero.Init, so the checkpoint is copied into [0]-sized partitions and the load stops "
                       "with a size mismatch; load the model in __init__ (deepspeed.initialize partitions "
                       "it at setup)")
            return


def _world(draft: Draft, call: Call) -> None:
    devices = call.kwargs.get("devices", "auto")
    nodes = call.kwargs.get("num_nodes", 1)
    nodes = nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else 1
    if isinstance(devices, list):
        count = len(devices)
    elif isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        count = devices
    elif isinstance(devices, str) and devices.strip().isdigit():
        count = int(devices)
    elif isinstance(devices, str) and "," in devices:
        count = len([d for d in devices.split(",") if d.strip()])
    else:  # "auto", -1, computed: every visible GPU
        draft.maybe("world_size", {1: "one GPU visible", 2: "several GPUs visible"},
                    f"{call.at('devices') if 'devices' in call.kwargs else call.at()}: Lightning takes every "
                    "visible device")
        return
    where = call.at("devices") if "devices" in call.kwargs else call.at()
    draft.set("world_size", count * nodes, where + (f" x num_nodes={nodes}" if nodes > 1 else "") +
              " (Lightning starts the processes itself)")


def _ddp(strategy: Any) -> tuple[tuple[bool, bool], bool]:
    """((find_unused_parameters, said explicitly), static_graph) of a DDP strategy name or DDPStrategy(...)."""
    if isinstance(strategy, str) and strategy.endswith("_find_unused_parameters_true"):
        return (True, True), False
    if isinstance(strategy, str) and strategy.endswith("_find_unused_parameters_false"):
        return (False, True), False
    if isinstance(strategy, Call) and strategy.name == "DDPStrategy":
        unused = strategy.kwargs.get("find_unused_parameters")
        return ((unused, True) if isinstance(unused, bool) else (False, False)), \
            strategy.kwargs.get("static_graph") is True
    return (False, False), False


def _fsdp(draft: Draft, strategy: Any, call: Call) -> bool:
    named = isinstance(strategy, str) and strategy in ("fsdp", "fsdp_cpu_offload")
    built = isinstance(strategy, Call) and strategy.name == "FSDPStrategy"
    if not (named or built):
        return False
    kwargs = strategy.kwargs if built else {}
    where = strategy.at() if built else call.at("strategy")
    draft.set("engine", "fsdp1", where)
    offload = strategy == "fsdp_cpu_offload" or kwargs.get("cpu_offload") not in (None, False)
    draft.set("offload", offload, where)
    orig = kwargs.get("use_orig_params", True)
    draft.set("fsdp_use_orig_params", orig if isinstance(orig, bool) else True,
              strategy.at("use_orig_params") if built and "use_orig_params" in kwargs else
              f"{where}: Lightning's FSDPStrategy sets use_orig_params=True")
    draft.set("fsdp_frozen_units_separate", False, f"{where}: each wrapped unit holds frozen weights and adapters")
    # DDP's setting: FSDP has none, so the HF Trainer's PeftModel default (True) read from the code does not apply.
    draft.set("find_unused_parameters", False, f"{where}: FSDP, not DDP (no find_unused_parameters)")
    if kwargs.get("activation_checkpointing_policy") is not None or kwargs.get("activation_checkpointing"):
        key = "activation_checkpointing_policy" if "activation_checkpointing_policy" in kwargs else \
            "activation_checkpointing"
        draft.set("checkpointing", "all", strategy.at(key))
        draft.set("checkpoint_impl", "torch-wrapper", f"{strategy.at(key)}: torch's apply_activation_checkpointing")
        draft.set("reentrant", False, "Lightning wraps with checkpoint_impl=CheckpointImpl.NO_REENTRANT "
                                      "(fabric/strategies/fsdp.py)")
    return True
