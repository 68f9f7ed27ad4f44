"""Adapters (PEFT LoRA / DoRA) and freezing.

One function builds the PEFT config, and the plan's module count comes from running exactly that config on a
meta-device skeleton, so what `check` reports is what `train` gets.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from typing import Any

import torch

from loraflow.config.schema import EXPERTS_TARGET, Config
from loraflow.errors import GuardError


def lora_config(config: Config, model: torch.nn.Module, modules_to_save: list[str] | None = None,
                ensure_weight_tying: bool = False, task_type: str = "CAUSAL_LM", targets: list[str] | None = None,
                towers=None):
    """PEFT's LoraConfig for the run on `model` (the module PEFT will wrap: the plan's meta skeleton or the loaded
    base, which share their names). `targets` overrides adapter.target_modules; `towers` (plan/towers.py TowerPlan
    list, image-text models) gives the exact module names each adapted tower matched, with the tower's own rank and
    alpha as PEFT rank/alpha patterns.

    The one place `experts` becomes peft's target_parameters, so the plan's matching, the trained model and the
    saved adapter_config.json read the same translation."""
    from peft import LoraConfig

    from loraflow.setup.modules import fused_parameters

    a = config.adapter
    extra: dict[str, Any] = {"ensure_weight_tying": True} if ensure_weight_tying else {}
    asked = a.target_modules if targets is None else targets
    modules = [t for t in asked if t != EXPERTS_TARGET]
    fused = _expert_parameters(config, model, asked)
    # PEFT expands the string "all-linear" itself; a list holding it would be read as a module name. An empty list
    # targets no module, only the parameters (peft's documented way to adapt parameters alone).
    target_modules: str | list[str] = "all-linear" if modules == ["all-linear"] else modules
    # Suffixes such as `experts.gate_up_proj` (peft matches a parameter's full name or a dotted suffix): one entry
    # per kind of fused weight, however many layers hold it.
    target_parameters = sorted({".".join(n.split(".")[-2:]) for n in fused}) or None
    if towers is not None:
        adapted = [t for t in towers if t.train == "adapter"]
        # Full names: PEFT matches a name or a dotted suffix, so each tower's modules and no other tower's. A
        # fused expert block a tower matched is adapted through its parameters (peft cannot wrap it as a module).
        split = {t.name: _split_fused(t.modules, list(fused_parameters(model))) for t in adapted}
        target_modules = sorted(n for modules_, _ in split.values() for n in modules_)
        target_parameters = sorted(p for _, params in split.values() for p in params) or None
        every = {name: modules_ + params for name, (modules_, params) in split.items()}
        extra["rank_pattern"] = {_exact(n): t.rank for t in adapted if t.rank != a.rank for n in every[t.name]}
        extra["alpha_pattern"] = {_exact(n): t.alpha for t in adapted if t.alpha != a.alpha for n in every[t.name]}
    return LoraConfig(
        r=a.rank, lora_alpha=a.alpha, lora_dropout=a.dropout, target_modules=target_modules,
        target_parameters=target_parameters, use_dora=a.method == "dora", modules_to_save=modules_to_save or None,
        task_type=task_type, **extra,
    )


def _split_fused(names: list[str], fused: list[str]) -> tuple[list[str], list[str]]:
    """Module names -> (those peft wraps as modules, the full names of the fused parameters of the others)."""
    blocks = {p.rpartition(".")[0] for p in fused}
    return [n for n in names if n not in blocks], [p for p in fused if p.rpartition(".")[0] in names]


def _expert_parameters(config: Config, model: torch.nn.Module, asked: list[str]) -> list[str]:
    """The fused expert parameters `experts` in `asked` stands for (none when it is absent); refused where the
    model has none, or where peft's parameter wrapper cannot carry the adapter asked."""
    from loraflow.errors import ConfigError
    from loraflow.setup.modules import fused_parameters, linear_names

    if EXPERTS_TARGET not in asked:
        return []
    fused = list(fused_parameters(model))
    a = config.adapter
    if not fused:
        names = ", ".join(linear_names(model)) or "none"
        raise ConfigError([f"adapter.target_modules names `{EXPERTS_TARGET}`, but this model has no fused expert "
                           "weights (parameters of three dimensions, one slice per expert): it is not a mixture of "
                           f"experts as transformers 5 stores one. Remove `{EXPERTS_TARGET}`; its linear layers are "
                           f"{names}, or use all-linear."])
    # peft 0.21's lora.ParamWrapper adds its delta to the parameter, so nothing can act on the adapter's input
    # alone (dropout) or on the merged weight's norm (DoRA).
    if a.method == "dora":
        raise ConfigError([f"adapter.method=dora with `{EXPERTS_TARGET}` in adapter.target_modules: peft adapts fused "
                           "expert weights through their parameters with plain LoRA only (lora.ParamWrapper refuses "
                           f"DoRA). Use adapter.method=lora, or remove `{EXPERTS_TARGET}` from adapter.target_modules."])
    if a.dropout:
        raise ConfigError([f"adapter.dropout={a.dropout:g} with `{EXPERTS_TARGET}` in adapter.target_modules: peft "
                           "adds the adapter to the fused expert weights themselves, where no dropout on the "
                           f"adapter's input can act (lora.ParamWrapper refuses it). Set adapter.dropout=0, or remove "
                           f"`{EXPERTS_TARGET}` from adapter.target_modules."])
    return fused


def _exact(name: str) -> str:
    """A PEFT rank/alpha pattern matching this module's full name (PEFT reads patterns as regexes that end a
    name)."""
    return re.escape(name)


def match_adapter_modules(skeleton: torch.nn.Module, config: Config, targets: list[str] | None = None) -> list[str]:
    """Full names of the modules PEFT puts an adapter on, found by running PEFT itself on a meta skeleton
    (`targets`: instead of adapter.target_modules). A module whose parameters peft wraps one by one (a fused
    expert block: a wrapper per parameter, nested) is named once."""
    from peft import get_peft_model
    from peft.tuners.tuners_utils import BaseTunerLayer

    from loraflow.errors import ConfigError

    peft_config = lora_config(config, skeleton, targets=targets)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            peft_model = get_peft_model(skeleton, peft_config)
    except ValueError as exc:  # NoMatchingPeftModuleError subclasses ValueError
        if "not found in the base model" in str(exc) or "No modules were targeted" in str(exc):
            return []
        # peft 0.21's all-linear reaches Mixtral's fused experts by itself (its transformers-5 conversion maps the
        # former expert Linears to target_parameters), where lora.ParamWrapper refuses DoRA and dropout.
        for needle, key, what, fix in (
                ("use_dora", "adapter.method=dora", "DoRA", "Use adapter.method=lora"),
                ("lora_dropout", f"adapter.dropout={config.adapter.dropout:g}", "dropout", "Set adapter.dropout=0")):
            if "ParamWrapper does not work with " + needle in str(exc):
                raise ConfigError([f"{key}: peft cannot put {what} on this model's fused expert weights, which "
                                   f"adapter.target_modules reaches ({exc}). {fix}, or name target modules outside "
                                   "the experts (e.g. [q_proj, k_proj, v_proj, o_proj])."]) from exc
        raise
    prefix = "base_model.model."
    names = [n[len(prefix):] if n.startswith(prefix) else n for n, m in peft_model.named_modules()
             if isinstance(m, BaseTunerLayer)]
    return list(dict.fromkeys(re.sub(r"(\.base_layer)+$", "", n) for n in names))


def match_tower_modules(skeleton: torch.nn.Module, config: Config, towers,
                        unreached: list[str] = ()) -> dict[str, list[str]]:
    """An image-text model's adapted towers -> the modules their targets (towers.<name>.target_modules, else
    adapter.target_modules) match inside that tower only: `all-linear` means the tower's own linear layers, never
    another tower's (PEFT's all-linear alone reaches into every tower)."""
    import copy

    from loraflow.families import TOWER_NAMES
    from loraflow.setup.towers import tower_of

    out: dict[str, list[str]] = {}
    for name in TOWER_NAMES:
        if config.towers.train_of(name, config.adapter.method) != "adapter":
            continue
        targets = getattr(config.towers, name).target_modules or config.adapter.target_modules
        # PEFT injects into the module it is given: each tower matches on its own copy of the skeleton.
        matched = match_adapter_modules(copy.deepcopy(skeleton), config, targets)
        out[name] = [n for n in matched if tower_of(n, towers) == name
                     and not any(n == u or n.startswith(u + ".") for u in unreached)]
    return out


def module_names_matching(info, entry: str) -> list[str]:
    """Modules of the model whose name is `entry` or ends with `.entry` (PEFT's suffix semantics)."""
    pattern = re.compile(rf"(^|\.){re.escape(entry)}$")
    return [n for n in info.module_names if pattern.search(n)]


def apply_adapters(model: torch.nn.Module, plan) -> torch.nn.Module:
    """Wrap the base model with PEFT per the plan (or leave it whole for full fine-tuning) and freeze."""
    config = plan.config
    if config.adapter.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        freeze_towers(model, plan)
        return model
    from peft import get_peft_model

    # SEQ_CLS makes PEFT train the score head in full and save it with the adapter (its modules_to_save).
    peft_config = lora_config(config, model, plan.modules_to_save, plan.ensure_weight_tying,
                              "SEQ_CLS" if plan.head == "score" else "CAUSAL_LM", towers=plan.towers or None)
    with warnings.catch_warnings():
        # PEFT reads transformers' deprecated `is_gradient_checkpointing` (peft 0.21 / transformers 5.23): not
        # something a user can act on.
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        # PEFT keeps adapters in float32 over a bf16 base when autocast_adapter_dtype=True; pure bf16 wants bf16.
        peft_model = get_peft_model(model, peft_config,
                                    autocast_adapter_dtype=plan.trainable_dtype == torch.float32)
    freeze_towers(peft_model, plan)
    in_full_tower = _unreached_in_full_towers(plan)
    for name, p in peft_model.named_parameters():
        # Trained full copies (modules_to_save) of a bf16 base compute in the trainable dtype; so do the modules of
        # such a tower that stay frozen because their output is never read (a vision encoder's post_layernorm still
        # runs on the encoder's fp32 output, and CPU LayerNorm refuses an fp32 input with bf16 weights, "mixed
        # dtype (CPU)", where CUDA's autocast would cast).
        if (p.requires_grad or in_full_tower(name)) and p.dtype != plan.trainable_dtype:
            p.data = p.data.to(plan.trainable_dtype)
    if not any(p.requires_grad for p in peft_model.parameters()):
        raise GuardError("no parameter is trainable after adding adapters [no-adapter-matched]. Set "
                         "adapter.target_modules to modules this model has.")
    return peft_model


def _unreached_in_full_towers(plan):
    """A test of parameter names: inside a module the forward never reads (plan.model.unreached) of a tower
    trained in full."""
    from loraflow.setup.towers import strip_peft

    full = [r for t in plan.towers if t.train == "full" for r in t.roots]
    prefixes = tuple(u + "." for u in plan.model.unreached if any(u == r or u.startswith(r + ".") for r in full))
    return lambda name: bool(prefixes) and strip_peft(name).startswith(prefixes)


def freeze_towers(model: torch.nn.Module, plan) -> None:
    """Keep the plan's frozen towers frozen: under full fine-tuning, and inside a tower trained in full that holds
    a frozen one (Qwen2-VL's merger sits in its vision encoder's trained copy)."""
    from loraflow.setup.towers import strip_peft, tower_of

    frozen = {t.name for t in plan.towers if t.train == "frozen" and t.name != "language"}
    unreached = plan.model.unreached
    if not frozen and not unreached:
        return
    towers = {t.name: t for t in plan.towers}
    for name, p in model.named_parameters():
        plain = strip_peft(name)
        if p.requires_grad and (tower_of(name, towers) in frozen or any(plain.startswith(u + ".") for u in unreached)):
            p.requires_grad_(False)


def adapter_modules(model: torch.nn.Module, with_modules: bool = False) -> dict[str, Any]:
    """Each adapter-carrying module (and each trained full copy) with its trainable parameters (or, with
    `with_modules`, the module itself)."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import ModulesToSaveWrapper

    out: dict[str, list[torch.nn.Parameter]] = {}
    for name, module in model.named_modules():
        if isinstance(module, (BaseTunerLayer, ModulesToSaveWrapper)):
            params = [p for p in module.parameters() if p.requires_grad]
            if params:
                out[name] = module if with_modules else params
    return out
