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
