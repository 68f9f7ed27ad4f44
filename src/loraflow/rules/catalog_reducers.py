"""The rules of gradient reducers: DDP's and ZeRO's per-parameter gradient hooks, which count how often a
gradient arrives in a step and refuse a second arrival that reentrant checkpoint recompute can cause."""

from __future__ import annotations

from loraflow.rules.refusals import REENTRANT_DISTRIBUTED_RL
from loraflow.rules.rule import Rule, register
from loraflow.rules.signs import Evidence, LogSigns, Message

register(Rule(
    id="ddp-reentrant-unused",
    title="DDP counts reentrant recompute's parameter hooks twice",
    verdict="fix",
    impact="crash",
    conditions="DDP, reentrant checkpointing, find_unused_parameters=True, no static graph",
    knobs=("find_unused_parameters", "reentrant", "ddp_static_graph"),
    when=lambda s: (s.gradient_reducer and s.checkpointed and s.reentrant is True and s.find_unused_parameters
                    and not s.ddp_static_graph),
    cause=("Reentrant checkpointing runs a second autograd pass in backward that fires each parameter's gradient "
           "hook again. DDP with find_unused_parameters=True marks a parameter ready per hook and refuses the "
           "second mark. The HF Trainer turns find_unused_parameters on for PEFT models with checkpointing."),
    fix="loraflow wraps DDP with find_unused_parameters=False: every adapter is used in every forward.",
    remedy=lambda s: {"find_unused_parameters": False},
    elsewhere="ddp_find_unused_parameters=False, or non-reentrant checkpointing, or static_graph=True",
    references=("https://github.com/huggingface/transformers/issues/23018",
                "https://github.com/pytorch/pytorch/issues/24005",
                "https://github.com/huggingface/accelerate/issues/2017"),
    fixed_in="not a bug: configuration",
    log=LogSigns(
        messages=(Message(r"Expected to mark a variable ready only once", "own",
                          "torch/csrc/distributed/c10d/reducer.cpp: mark_variable_ready"),
                  REENTRANT_DISTRIBUTED_RL,  # Axolotl's refusal (refusals.py)
                  Message(r"has been marked as ready twice|marked as ready twice", "own",
                          "reducer.cpp (names the parameter, with TORCH_DISTRIBUTED_DEBUG)")),
        evidence=(Evidence("find_unused", 2, "DDP's unused-parameter search is on"),
                  Evidence("checkpointing", 1, "checkpointing is in use"),
                  Evidence("reentrant", 1, "reentrant checkpointing is named"),
                  # The reducer's message itself names a second mechanism (a parameter used outside the forward);
                  # AdaLoRA's regularization is one, and this rule's fix does not cure it (peft#663).
                  Evidence("adalora", -8, "AdaLoRA's orthogonal regularization uses lora_A/lora_B again after the "
                           "forward: a second gradient hook whatever find_unused_parameters says", excludes=True))),
))

register(Rule(
    id="adalora-reentrant-ddp",
    title="AdaLoRA's regularization under reentrant checkpointing marks DDP's adapter gradients ready twice",
    verdict="error",
    impact="crash",
    conditions="AdaLoRA with a task type (its orthogonal regularization on), DDP without a static graph, reentrant "
               "checkpointing with inputs that require grad; find_unused_parameters either way, one process or "
               "many, every peft release",
    knobs=("reentrant", "ddp_static_graph"),
    when=lambda s: (s.gradient_reducer and s.adalora_orth_reg and s.checkpointed and s.reentrant is True
                    and s.embedding_output_requires_grad and not s.ddp_static_graph),
    cause=("AdaLoRA's orthogonal regularization multiplies every lora_A and lora_B by itself a second time in the "
           "forward, outside the checkpointed layers. Reentrant checkpointing recomputes each layer in its own inner "
           "backward pass, so each adapter weight's gradient hook fires once there and once more from the "
           "regularization's path; DDP's reducer refuses the second mark on the first backward (`Expected to mark a "
           "variable ready only once`, naming a lora_B with TORCH_DISTRIBUTED_DEBUG). Turning "
           "find_unused_parameters off does not help, as it does for plain LoRA (rule ddp-reentrant-unused)."),
    fix="loraflow does not train AdaLoRA; with LoRA it checkpoints non-reentrantly.",
    elsewhere="non-reentrant checkpointing (gradient_checkpointing_kwargs={'use_reentrant': False}), or DDP "
              "static_graph=True (ddp_static_graph); orth_reg_weight=0 does not help (peft still builds the term)",
    references=("https://github.com/huggingface/peft/issues/663", "https://github.com/huggingface/peft/issues/1745",
                "https://github.com/huggingface/peft/blob/v0.21.2/src/peft/tuners/adalora/model.py "
                "(AdaLoraModel.forward: orth_reg_weight, p @ p.T)"),
    fixed_in="not fixed in peft (0.21.2)",
    log=LogSigns(
        messages=(Message(r"Expected to mark a variable ready only once", "shared",
                          "torch/csrc/distributed/c10d/reducer.cpp: mark_variable_ready"),
                  Message(r"lora_[AB](\.default)?(\.weight)? has been marked as ready twice", "shared",
                          "reducer.cpp (names the parameter, with TORCH_DISTRIBUTED_DEBUG)")),
        evidence=(Evidence("adalora", 6, "AdaLoRA is in use: its regularization reuses the adapter weights",
                           decisive=True),),
        prior=0.2,
        tells_apart="AdaLoRA in the traceback or the launch (AdaLoraConfig, adalora_*); plain LoRA with "
                    "find_unused_parameters is rule ddp-reentrant-unused"),
))

register(Rule(
    id="zero-grad-reduced-twice",
    title="ZeRO reduces a gradient twice when reentrant recompute runs one step's forwards apart",
    verdict="fix",
    impact="crash",
    conditions="DeepSpeed ZeRO-2 or ZeRO-3 (gradients partitioned as they are produced), reentrant checkpointing, "
               "and trained weights used by more than one checkpointed forward before one backward (chosen and "
               "rejected forwards run apart, two losses over separate forwards, a module applied twice)",
    knobs=("reentrant", "forwards_per_step"),
    when=lambda s: (s.engine_spec.zero and s.zero_stage >= 2 and s.checkpointed and s.reentrant is True
                    and s.forwards_per_step > 1),
    cause=("ZeRO-2/3 reduce each parameter's gradient into its partition from a hook that fires when the gradient "
           "is accumulated, and assert that this happens once per step. Reentrant checkpointing recomputes each "
           "checkpointed forward in an autograd pass of its own during backward, so a weight that took part in two "
           "checkpointed forwards has its gradient accumulated, and its hook fired, once per pass: the second "
           "reduction is refused. Non-reentrant checkpointing recomputes inside the one backward graph, where the "
           "two gradients are summed before the hook."),
    fix="loraflow checkpoints non-reentrantly under ZeRO-2/3 when a step runs more than one forward "
        "(checkpointing.reentrant=false).",
    remedy=lambda s: {"reentrant": False},
    elsewhere="gradient_checkpointing_kwargs={'use_reentrant': False}, or one concatenated forward (DPO's chosen and "
              "rejected in one batch), or one backward per forward",
    references=("https://github.com/deepspeedai/DeepSpeed/issues/627",
                "https://github.com/deepspeedai/DeepSpeed/issues/988",
                "https://github.com/haotian-liu/LLaVA/blob/main/llava/train/train.py (use_reentrant False: 'The "
                "parameter 577 has already been reduced')",
                "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/zero/stage_1_and_2.py "
                "(reduce_independent_p_g_buckets_and_remove_grads)"),
    fixed_in="not a bug: configuration",
    log=LogSigns(
        messages=(Message(r"has already been reduced\. +Gradient computed twice for this partition", "own",
                          "deepspeed/runtime/zero/stage_1_and_2.py: reduce_independent_p_g_buckets_and_remove_grads"),
                  Message(r"Multiple gradient reduction is currently not supported", "own",
                          "deepspeed/runtime/zero/stage_1_and_2.py"),
                  REENTRANT_DISTRIBUTED_RL),  # Axolotl's refusal, shared with ddp-reentrant-unused (refusals.py)
        evidence=(Evidence("checkpointing", 1, "checkpointing is in use"),
                  Evidence("reentrant", 1, "reentrant checkpointing is named"),
                  Evidence("deepspeed", 2, "DeepSpeed reduces the gradients, not DDP")),
        prior=1.0,
        tells_apart="DeepSpeed's own assertion that a partition's gradient was reduced twice"),
))


NO_SYNC_ASSERTED = "0.16.0"
"""DeepSpeed's engine has a no_sync context manager from 0.16.0 (PR #6675), which asserts the ZeRO stage does not
partition gradients (stage 2 and 3); before it accelerate found no no_sync on the engine and used a null context."""
ACCELERATE_SKIPS_NO_SYNC = "1.9.0"
"""accelerate's no_sync (which its accumulate() enters between micro-steps) skips a DeepSpeed engine at ZeRO stage 2
or 3 from 1.9.0 (accelerator.py no_sync: `zero_stage < 2`; huggingface/accelerate#3481)."""
TRAINER_SKIPS_NO_SYNC = "4.48.0"
"""The HF Trainer's loop stops calling accelerator.no_sync under DeepSpeed in 4.48.0 (huggingface/transformers PR
#35157); 4.47 called it directly between micro-steps, earlier releases through accelerator.accumulate."""


def _no_sync(s) -> bool:
    from loraflow.rules.rule import older

    # ZeRO from stage 2 partitions gradients (DeepSpeedEngine.zero_optimization_partition_gradients).
    if not (s.engine_spec.zero and s.zero_stage >= 2 and s.grad_accum_steps > 1):
        return False
    return s.accumulation_loop == "accelerate" or (s.accumulation_loop == "hf-trainer" and
                                                   older(s, "transformers", TRAINER_SKIPS_NO_SYNC))


register(Rule(
    id="zero-no-sync-accumulation",
    title="Gradient accumulation enters DeepSpeed's no_sync, which ZeRO-2/3 refuse",
    verdict="fix",
    impact="crash",
    conditions="DeepSpeed >= 0.16.0 at ZeRO stage 2 or 3 with gradient accumulation (more than one micro-batch per "
               "optimizer step) in a loop that enters accelerate's no_sync between micro-steps: the HF Trainer "
               "before transformers 4.48 (LLaMA-Factory, axolotl, ms-swift, TRL on it), a custom loop's "
               "accelerator.accumulate(model), with accelerate before 1.9.0",
    knobs=("grad_accum_steps", "zero_stage"),
    affected={"deepspeed": f">={NO_SYNC_ASSERTED}", "accelerate": f"<{ACCELERATE_SKIPS_NO_SYNC}"},
    boundaries={"transformers": (TRAINER_SKIPS_NO_SYNC,)},
    when=_no_sync,
    cause=("accelerate skips the gradient all-reduce between the micro-batches of an accumulation window with the "
           "model's no_sync context, as DDP allows. DeepSpeed's engine gained a no_sync in 0.16.0 that asserts the "
           "ZeRO stage does not partition gradients: stages 2 and 3 reduce each gradient into its owner's partition "
           "as backward produces it, so they cannot skip the reduction. The first micro-step of every window "
           "stops on the assertion; before 0.16.0 the engine had no no_sync and accelerate used a null context."),
    fix="loraflow leaves accumulation to DeepSpeed's own engine (backward and step count the micro-steps), never "
        "entering no_sync under ZeRO.",
    remedy=lambda s: {"grad_accum_steps": 1},
    elsewhere="upgrade accelerate to 1.9.0 or later (its no_sync skips ZeRO-2/3) or transformers to 4.48.0 or "
              "later for the HF Trainer; else pin deepspeed<0.16.0, or set gradient_accumulation_steps 1 and raise "
              "the per-device batch",
    references=("https://github.com/deepspeedai/DeepSpeed/issues/6793",
                "https://github.com/huggingface/transformers/issues/34984",
                "https://github.com/huggingface/transformers/pull/35157",
                "https://github.com/huggingface/accelerate/issues/3481",
                "https://github.com/hiyouga/LlamaFactory/issues/6194",
                "https://github.com/modelscope/ms-swift/issues/4230",
                "https://github.com/eosphoros-ai/DB-GPT-Hub/issues/298", "https://github.com/kongds/E5-V/issues/23",
                "https://github.com/wzhouad/WPO/issues/4", "https://github.com/JyChen9811/FaithDiff/issues/24",
                "https://github.com/yuanzhoulvpi2017/zero_nlp/issues/204"),
    fixed_in=f"accelerate {ACCELERATE_SKIPS_NO_SYNC}; transformers {TRAINER_SKIPS_NO_SYNC} (the HF Trainer)",
    log=LogSigns(
        messages=(Message(r"no.sync context manager is incompatible with gradient ?partitioning logic of ZeRO stage",
                          "own", "deepspeed/runtime/engine.py: DeepSpeedEngine.no_sync", "deepspeed>=0.16.0"),),
        frames=(Message(r"deepspeed[/\\.]runtime[/\\.]engine\.py:no_sync$", "own"),),
        prior=1.0,
        tells_apart="DeepSpeed's no_sync assertion"),
))
