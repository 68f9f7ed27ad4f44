"""DeepSpeed-Chat (DeepSpeedExamples applications/DeepSpeed-Chat): `deepspeed main.py ...` in
training/step1_supervised_finetuning, step2_reward_model_finetuning, step2_dpo_finetuning and step3_rlhf_finetuning,
usually from their training_scripts/*.sh.

DeepSpeed-Chat has its own LoRA (dschat/utils/module/lora.py, not PEFT): `--lora_dim N` swaps linear layers whose
name contains `--lora_module_name` (default "decoder.layers.", OPT's naming) and only `--only_optimize_lora` freezes
the base weights. Checkpointing is `model.gradient_checkpointing_enable()` without kwargs, so transformers' default
decides reentrancy.
"""

from __future__ import annotations

import re

from loraflow.frontends import keys
from loraflow.frontends.argv import Command, parse_bool, parse_flags, script_command
from loraflow.frontends.base import Framework, FrontendResult, Mitigation
from loraflow.frontends.common import Draft, at_least, finish_world, int_value, mitigated
from loraflow.frontends.model_types import model_name_facts
from loraflow.frontends.intent import infer
from loraflow.frontends.table import (
    Default,
    Field,
    all_if_on,
    apply_table,
    at_stage,
    checkpointing_on,
    fact,
    switch,
    zero_stage,
)

NAME = "deepspeed-chat"
_DIRS = {"step1_supervised_finetuning": "sft", "step2_reward_model_finetuning": "rm", "step2_dpo_finetuning": "dpo",
         "step3_rlhf_finetuning": "ppo"}
DISTINCT = {"lora_dim", "only_optimize_lora", "lora_module_name", "actor_zero_stage", "actor_lora_dim",
            "enable_hybrid_engine", "actor_model_name_or_path", "critic_model_name_or_path",
            "actor_gradient_checkpointing",
            "offload_reference_model", "num_padding_at_beginning", "data_split", "data_output_path",
            "sft_only_data_path"}
_SWITCHES = {"gradient_checkpointing", "offload", "only_optimize_lora", "compute_fp32_loss", "enable_tensorboard",
             "add_eot_token", "print_loss", "enable_hybrid_engine", "unpin_actor_parameters", "release_inference_cache",
             "offload_reference_model", "offload_reward_model", "actor_gradient_checkpointing",
             "critic_gradient_checkpointing", "enable_ema", "enable_mixed_precision_lora", "align_overflow",
             "print_answers", "enable_test_mode", "deepspeed", "deepscale", "deepspeed_mpi"}
# deepspeed.add_config_arguments(parser) in every main.py adds these (deepspeed/__init__.py).
_DEEPSPEED_ARGS = {"deepspeed", "deepspeed_config", "deepscale", "deepscale_config", "deepspeed_mpi"}
FLAGS = {"zero_stage": "--zero_stage (step 3: --actor_zero_stage)",
         "checkpointing": "--gradient_checkpointing (step 3: --actor_gradient_checkpointing)",
         "adapter": "--lora_dim / --only_optimize_lora", "input_grad_hook": "--only_optimize_lora",
         "offload": "--offload", "precision": "--dtype", "matched_modules": "--lora_module_name",
         "world_size": "deepspeed --num_gpus", "generation_gather": "--enable_hybrid_engine"}


HOOK = Mitigation(("reentrant-frozen-inputs",), "2023.8.3", "--only_optimize_lora with checkpointing calls "
                  "enable_input_require_grads()", "dschat/utils/module/lora.py make_model_gradient_checkpointing_"
                  "compatible (PR #658)")
# Flags that date a launch line (commit dates of DeepSpeedExamples applications/DeepSpeed-Chat).
_ERAS = (("lora_learning_rate", ">=2023.8.14"), ("enable_mixed_precision_lora", ">=2023.8.18"),
         ("dtype", ">=2023.9.22"), ("dropout", ">=2023.10.3"), ("actor_dropout", ">=2023.10.3"),
         ("disable_dropout", "<2023.10.3"), ("disable_actor_dropout", "<2023.10.3"),
         ("compute_fp32_loss", ">=2023.10.4"), ("add_eot_token", ">=2023.10.17"), ("eot_token", ">=2024.10.30"))
# Model families whose layers live under `decoder.layers.` (OPT's naming), the default --lora_module_name scope.
_OPT_STYLE = re.compile(r"(^|[/_-])opt([-_]|$)|galactica", re.I)
# A name that says which other family it is; a local path that says none (`.../step1_supervised_finetuning/output`,
# the step-1 model a step-2 or step-3 launch starts from) may be OPT as well, so its layers stay open.
# Short names are matched at a word's start (`ckpt5`, `output_out5` hold no T5).
_OTHER_FAMILY = re.compile(r"llama|vicuna|alpaca|mistral|mixtral|qwen|gemma|bloom|falcon|pythia|baichuan|internlm|"
                           r"deepseek|stablelm|codegen|phi[-_]?\d|(^|[/_.-])(gpt|glm|chatglm|mpt[-_]|yi[-_]|t5)",
                           re.I)


def _lora_scope(draft: Draft, model: str, flag: str, given: bool) -> None:
    """The default scope `decoder.layers.` matches OPT's layers only: decide, or leave to the unseen model."""
    shown = f"--{flag} {'decoder.layers.' if given else '(default decoder.layers.)'}"
    if model and "$" not in model and not _OPT_STYLE.search(model) and _OTHER_FAMILY.search(model):
        draft.set("matched_modules", 0, f"{shown} (OPT's naming) with {model}")
        draft.note(f"{model} does not name its decoder layers `decoder.layers.N` (OPT's naming), so the scope "
                   f"`decoder.layers.` converts no linear layer to LoRA; DeepSpeed-Chat's Llama-2 scripts pass "
                   "--lora_module_name \"layers.\"")
    elif not _OPT_STYLE.search(model):
        draft.maybe("matched_modules", {None: "the model is OPT-style (layers under decoder.layers.)",
                                        0: "the model is not OPT-style, so no layer becomes LoRA"},
                    f"{shown} matches OPT's layer names only, and the model ({model or 'not given'}) is not visible")


def stage_of(cmd: Command, given: set[str]) -> tuple[str, str]:
    for part, stage in _DIRS.items():
        if part in cmd.program:
            return stage, cmd.program
    if given & {"actor_zero_stage", "actor_model_name_or_path", "enable_hybrid_engine", "actor_lora_dim"}:
        return "ppo", "step-3 flags (--actor_*)"
    if "beta" in given:
        return "dpo", "--beta (step2_dpo_finetuning)"
    if "num_padding_at_beginning" in given:
        return "rm", "--num_padding_at_beginning (step2_reward_model_finetuning)"
    return "sft", f"{cmd.program} (not under a step directory; read as step 1)"


def _table(p: str, main: str) -> tuple[Field, ...]:
    """What main.py's flags set; `p` is step 3's `actor_` prefix, `main` the step's main.py (the defaults' source)."""
    return (
        # deepspeed.initialize wraps the model at every stage, ZeRO 0 included (main.py).
        fact("engine", "deepspeed", f"{main} always calls deepspeed.initialize"),
        Field("zero_stage", (f"{p}zero_stage",), zero_stage,
              Default(0, f"default ({main}: --{p}zero_stage default 0)")),
        # get_train_ds_config offloads both optimizer and parameters (dschat/utils/ds_utils.py).
        Field("offload", ("offload",), switch),
        Field("precision", ("dtype",), lambda v, w: "bf16-mixed" if v == "bf16" else "fp16-mixed", Default(
            "fp16-mixed", f"default ({main}: --dtype fp16; DeepSpeed fp16 keeps fp32 master weights, "
            "dschat/utils/ds_utils.py)")),
    )


def _checkpointing(p: str, main: str) -> tuple[Field, ...]:
    return (
        Field("checkpointing", (f"{p}gradient_checkpointing",), all_if_on),
        fact("checkpoint_impl", "transformers", f"{main}: model.gradient_checkpointing_enable()",
             when=checkpointing_on),
        # No kwargs: transformers < 5 passes use_reentrant=True, >= 5 False (transformers PR #43203;
        # trl/trainer/sft_trainer.py checks the same 5.0.0 boundary).
        Field("reentrant", when=checkpointing_on, default=Default(
            True, "default (transformers < 5.0 gradient_checkpointing_enable without kwargs; DeepSpeed-Chat passes "
            "none)", since=(("transformers", "5.0.0", False, "default (transformers >= 5.0 "
                             "gradient_checkpointing_enable without kwargs; DeepSpeed-Chat passes none)"),))),
    )


# What every step does whatever its flags.
_FACTS = (
    fact("forwards_per_step", 1, "chosen and rejected share one batch and one forward (step2 main.py)",
         when=at_stage("dpo", "rm")),
    fact("adapter_save_gather", True, "save_zero_three_model gathers each parameter (dschat/utils/utils.py)"),
)


def _adapter(draft: Draft, given: dict, p: str, main: str, step3: bool) -> int:
    """DeepSpeed-Chat's own LoRA: the base weights freeze only with --only_optimize_lora. Returns the LoRA dim."""
    dim_arg = given.get(f"{p}lora_dim")
    lora_dim = int_value(dim_arg.value, dim_arg.raw, "a LoRA dimension") if dim_arg is not None else 0
    lora_flag = f"--{p}lora_dim"
    if lora_dim > 0 and _on(given, "only_optimize_lora"):
        draft.set("adapter", "lora", f"{lora_flag} {lora_dim} --only_optimize_lora")
    elif lora_dim > 0:
        draft.set("adapter", "full", f"{lora_flag} {lora_dim} without --only_optimize_lora")
        draft.note("without --only_optimize_lora DeepSpeed-Chat trains the base weights together with the LoRA "
                   "weights (only_optimize_lora_parameters in dschat/utils/module/lora.py is what freezes them): "
                   "read as full fine-tuning")
    else:
        draft.set("adapter", "full", given[f"{p}lora_dim"].raw if f"{p}lora_dim" in given else
                  f"default ({main}: {lora_flag} 0, no LoRA)")
    scope_flag = f"{p}lora_module_name"
    scope = given[scope_flag].one() if scope_flag in given else "decoder.layers."
    model = given.get("actor_model_name_or_path" if step3 else "model_name_or_path")
    if model is not None:
        model_name_facts(draft, model.one() or "", model.raw)
    if lora_dim > 0 and scope == "decoder.layers.":
        _lora_scope(draft, (model.one() if model is not None else "") or "", scope_flag, scope_flag in given)
    return lora_dim


def _copy_adapter(draft: Draft, extra: list, dim_given: bool) -> set[str]:
    """A modified main.py with an adapter switch of its own (`--use_lora --lora_r 64`, which DeepSpeed-Chat's
    argparse would refuse): its LoRA, read from that switch when --lora_dim does not say. Returns the flags read."""
    intent = infer({a.name: (a.value, a.raw) for a in extra})
    if dim_given or intent.adapter not in ("lora", "dora"):
        return set()
    draft.set("adapter", intent.adapter, f"{intent.sources['adapter']} (a flag DeepSpeed-Chat's main.py does not "
              "take: a modified copy's own adapter switch)")
    draft.note(f"{intent.sources['adapter']}: main.py is a modified DeepSpeed-Chat copy with LoRA of its own; read as "
               "LoRA on a frozen base, which its code decides")
    return intent.used | {a.name for a in extra if a.name in ("lora_r", "lora_alpha", "lora_dropout")}


def _input_grad_hook(draft: Draft, given: dict, lora_dim: int) -> None:
    if not checkpointing_on(draft):
        return
    new = at_least(draft, "transformers", "5.0.0")
    if lora_dim > 0 and _on(given, "only_optimize_lora"):
        hooked = mitigated(draft, "reentrant-frozen-inputs")
        draft.set("input_grad_hook", hooked, "--only_optimize_lora: make_model_gradient_checkpointing_compatible "
                  "calls enable_input_require_grads() (dschat/utils/module/lora.py, since PR #658, 2023-08-03)"
                  if hooked else "DeepSpeed-Chat before PR #658 (2023-08-03) adds no input-grad hook (its main.py "
                  "asserts against --gradient_checkpointing with --only_optimize_lora; copies without the assert "
                  "crash in backward)")
    elif new:
        draft.set("input_grad_hook", True, "transformers >= 5 gradient checkpointing hooks the embedding output "
                  "for input_ids models (transformers modeling_utils.py)")


def _step3(draft: Draft, given: dict, lora_dim: int) -> None:
    draft.set("generation", True, "step 3 samples with actor.generate (dschat/rlhf/ppo_trainer.py)")
    hybrid = _on(given, "enable_hybrid_engine")
    if hybrid and lora_dim > 0:
        draft.set("merge_in_sharded", True, "--enable_hybrid_engine fuses the LoRA weights into the actor's "
                  "weights before each generation (fuse_lora_weight, deepspeed/runtime/hybrid_engine.py)")
    draft.set("generation_gather", hybrid, "--enable_hybrid_engine (gathers once per generate)" if hybrid else
              "default: no --enable_hybrid_engine, ZeRO-3 gathers at every decoding step")
    draft.set("train_mode_at_backward", True, "generate_experience calls eval() then train() "
              "(dschat/rlhf/ppo_trainer.py)")


def _on(given: dict, name: str) -> bool:
    a = given.get(name)
    return a is not None and parse_bool(a.value, a.raw)


def from_command(cmd: Command, versions: dict) -> FrontendResult:
    draft = Draft(NAME, versions)
    args, positionals, _ = parse_flags(cmd.args, switches=_SWITCHES, lists={"data_path"})
    for extra in positionals:
        draft.unknown.append(f"{extra} (a positional argument; main.py takes none)")
    given = {a.name: a for a in args}
    stage, stage_source = stage_of(cmd, set(given))
    draft.set("stage", stage, stage_source)
    step3 = stage == "ppo"
    p = "actor_" if step3 else ""
    draft.eras_from("deepspeed-chat", "DeepSpeed-Chat", _ERAS, given, prefix="--")
    main = f"DeepSpeed-Chat training/{next(k for k, v in _DIRS.items() if v == stage)}/main.py"
    options = {n: (a.value, a.raw) for n, a in given.items()}
    apply_table(draft, options, _table(p, main))
    lora_dim = _adapter(draft, given, p, main, step3)
    apply_table(draft, options, _checkpointing(p, main))
    _input_grad_hook(draft, given, lora_dim)
    draft.set("use_cache", False, f"{main} calls the model with use_cache=False")
    apply_table(draft, options, _FACTS)
    if step3:
        _step3(draft, given, lora_dim)
    used = _copy_adapter(draft, [a for a in args if a.name not in keys.DEEPSPEED_CHAT and a.name not in
                                 _DEEPSPEED_ARGS], f"{p}lora_dim" in given)
    for a in args:
        if a.name not in keys.DEEPSPEED_CHAT and a.name not in _DEEPSPEED_ARGS and a.name not in used:
            draft.unknown.append(a.raw)
    draft.flag(zero_stage=f"--{p}zero_stage", checkpointing=f"--{p}gradient_checkpointing",
               adapter=f"--{p}lora_dim / --only_optimize_lora",
               input_grad_hook="--only_optimize_lora (adds enable_input_require_grads)", offload="--offload",
               precision="--dtype", matched_modules=f"--{p}lora_module_name", world_size="deepspeed --num_gpus",
               generation_gather="--enable_hybrid_engine")
    finish_world(draft, cmd)
    return draft.result()


def from_files(paths: list[str], versions: dict) -> FrontendResult:
    """DeepSpeed-Chat is configured by flags only: read the launch line of a training script."""
    cmd = script_command(paths, NAME, "deepspeed main.py ... (e.g. training_scripts/llama2/run_llama2_7b_lora.sh)")
    if "/" not in cmd.program and any(part in paths[0] for part in _DIRS):
        # Scripts run `deepspeed main.py` from their step directory; keep which step it is.
        cmd.program = next(f"{part}/main.py" for part in _DIRS if part in paths[0])
    return from_command(cmd, versions)


def _recognise(view) -> bool:
    # `--lora_dim` alone is also the flag of many scripts derived from DeepSpeed-Chat's (a `train.py` with LoRA of
    # its own): it names DeepSpeed-Chat only beside its `main.py` or another flag of its own.
    own = view.flags & DISTINCT
    return ("DeepSpeed-Chat" in view.program or "_finetuning/" in view.program or bool(own - {"lora_dim"}) or
            (bool(own) and view.program.replace("\\", "/").rsplit("/", 1)[-1] == "main.py"))


FRAMEWORK = Framework(name=NAME, title="DeepSpeed-Chat", module="deepspeed_chat", recognise=_recognise, flags=FLAGS,
                      log_paths=r"dschat[/\\]|DeepSpeed-Chat|deepspeed_chat|applications[/\\]DeepSpeed-Chat",
                      dated=True, aliases=("deepspeed_chat", "dschat"), mitigations=(HOOK,))
