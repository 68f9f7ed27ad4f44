"""The rules, one per known conflict, with the ids of ../shared/docs/failure-catalog.md.

This module holds the rules of a single process (checkpointing, cache, packing, adapters, precision); the rules of
sharded and distributed engines (ZeRO, FSDP, DDP) are in catalog_sharded.py. Every rule has a test that triggers it
and one that keeps it silent (tests/rules/test_rules.py), and, where it can be reproduced, a live probe (probes/).
"""

from __future__ import annotations

from loraflow.rules.combination import Combination
from loraflow.rules.refusals import REENTRANT_PARTLY_FROZEN, TIED_OUTPUT_LORA
from loraflow.rules.rule import Rule, register
from loraflow.rules.signs import NO_GRAD_FN as _NO_GRAD_FN
from loraflow.rules.signs import (
    RECOMPUTE_COUNT,
    RECOMPUTE_FRAMES,
    RECOMPUTE_MESSAGES,
    ZERO_TRAINABLE,
    Evidence,
    LogSigns,
    Message,
    recompute_rivals,
)
from loraflow.rules.signs import REENTRANT_WARNING as _REENTRANT_WARNING


def _reentrant_without_input_grad(s: Combination) -> bool:
    return s.checkpointing != "off" and s.reentrant is True and not s.embedding_output_requires_grad


register(Rule(
    id="reentrant-frozen-inputs",
    title="Reentrant checkpointing with frozen embeddings builds no graph",
    verdict="fix",
    impact="crash",
    conditions="checkpointing on every layer, reentrant, base embeddings frozen, no input-grad hook",
    knobs=('reentrant', 'input_grad_hook'),
    when=lambda s: _reentrant_without_input_grad(s) and s.checkpointing == "all",
    cause=("Reentrant checkpointing runs each layer under no_grad and only records a graph when a tensor input "
           "requires grad. Adapter weights are not inputs, and frozen embeddings give an input that does not "
           "require grad, so nothing connects the loss to the adapters."),
    fix=("loraflow registers a forward hook that marks the embedding output as requiring grad (or choose "
         "checkpointing.reentrant=false, which needs no hook)."),
    remedy=lambda s: {"input_grad_hook": True},
    elsewhere=("call model.enable_input_require_grads(), or pass gradient_checkpointing_kwargs="
               "{'use_reentrant': False}"),
    references=("https://github.com/huggingface/transformers/issues/21381",
                "https://github.com/huggingface/transformers/pull/25846",
                "https://github.com/huggingface/trl/issues/3089",
                "https://pytorch.org/docs/stable/checkpoint.html"),
    fixed_in="transformers 5.x adds the hook for input_ids models in its own checkpointing; raw "
             "torch.utils.checkpoint does not",
    symptoms=("no-gradient-reentrant",),
    # The error also follows a backward under no_grad or a model with nothing trainable: shared, and told apart
    # by torch's reentrant-checkpoint warning and checkpointing in the same log.
    log=LogSigns(
        messages=(Message(_NO_GRAD_FN, "shared", "torch autograd: run_backward (torch/csrc/autograd/engine.cpp)"),
                  REENTRANT_PARTLY_FROZEN),  # Axolotl's refusal (refusals.py)
        evidence=(Evidence("reentrant_warning", 6, "torch's reentrant-checkpoint warning: a checkpointed segment got "
                           "no input that requires grad", decisive=True, alone=True),
                  Evidence("checkpointing", 3, "activation checkpointing is in use"),
                  Evidence("reentrant", 2, "reentrant checkpointing is named"),
                  Evidence("peft", 1, "adapters train on a frozen base")),
        prior=3.0,
        tells_apart="gradient checkpointing is on, the embeddings are frozen (an adapter, a frozen tower) and nothing "
                    "calls enable_input_require_grads(); torch warned `None of the inputs have requires_grad=True` "
                    "earlier in the log"),
))

def _tower_unhooked(s: Combination) -> bool:
    """Adapters in a vision tower checkpointed reentrant, with no hook on the tower's own input."""
    hooked = s.input_grad_hook and s.tower_input_hook
    return s.tower_adapters and s.checkpointing != "off" and s.reentrant is True and not hooked


register(Rule(
    id="reentrant-partial-silent",
    title="Reentrant checkpointing silently leaves some adapters without gradients",
    verdict="fix",
    impact="silent",
    conditions="reentrant checkpointing, and either only some layers checkpointed with frozen embeddings and no "
               "input-grad hook, or adapters in a vision tower whose patch embedding no hook marks",
    knobs=('reentrant', 'input_grad_hook', 'tower_input_hook'),
    when=lambda s: (_reentrant_without_input_grad(s) and s.checkpointing == "partial") or _tower_unhooked(s),
    cause=("As in reentrant-frozen-inputs, a reentrant-checkpointed layer whose input does not require grad "
           "records no graph. When another path still carries the loss there is no error: with only some layers "
           "checkpointed, the adapters of the checkpointed ones never learn; in a vision-language model whose "
           "vision tower has adapters, enable_input_require_grads() before transformers 5 marks only the token "
           "embeddings, so the tower's blocks (fed by a frozen patch embedding) never learn while the language "
           "model's adapters do."),
    fix=("loraflow registers the input-grad hook through transformers' enable_input_require_grads, which from "
         "transformers 5 marks each sub-model's input embeddings, a vision tower's patch embedding included; the "
         "first-step gradient guard would catch a miss (or choose checkpointing.reentrant=false)."),
    remedy=lambda s: {"input_grad_hook": True, "tower_input_hook": True} if _tower_unhooked(s) else
    {"input_grad_hook": True},
    elsewhere=("use non-reentrant checkpointing (gradient_checkpointing_kwargs={'use_reentrant': False}); else call "
               "model.enable_input_require_grads() and, on transformers < 5 with adapters in the vision tower, "
               "register the same forward hook on the tower's patch embedding"),
    references=("https://github.com/huggingface/transformers/issues/21381",
                "https://github.com/huggingface/peft/issues/1142",
                "https://github.com/huggingface/peft/issues/2880",
                "https://github.com/huggingface/transformers/pull/41993",
                "https://github.com/2U1/Qwen-VL-Series-Finetune/issues/193"),
    fixed_in="partial checkpointing: not fixed upstream; vision towers: transformers 5.0 (PR #41993) for models that "
             "name their patch embedding",
    symptoms=("no-gradient-reentrant",),
    log=LogSigns(
        messages=(Message(_REENTRANT_WARNING, "warning", "torch/utils/checkpoint.py: CheckpointFunction.forward "
                          "(check_backward_validity)"),
                  Message(r"trainable parameters got no gradient", "own", "loraflow guards.check_first_gradients"),
                  REENTRANT_PARTLY_FROZEN),  # Axolotl's refusal, shared with reentrant-frozen-inputs (refusals.py)
        evidence=(Evidence("checkpointing", 1, "activation checkpointing is in use"),
                  Evidence("peft", 1, "adapters train on a frozen base"),
                  Evidence("vision", 2, "a vision tower is in the run: before transformers 5 the input-grad hook "
                           "marks only the token embeddings, so adapters inside the tower get no gradient")),
        prior=1.0,
        tells_apart="training runs on with torch's `None of the inputs have requires_grad=True` warning: the layers "
                    "it names never update their adapters (harmless only if every warned layer is frozen, such as a "
                    "frozen vision tower; a tower with LoRA in it, vision_lora or targets under visual/vision_tower, "
                    "is not frozen)"),
))

register(Rule(
    id="cache-during-recompute",
    title="KV cache written again while checkpointed layers recompute",
    verdict="fix",
    impact="silent",
    conditions="checkpointing through torch's checkpoint_wrapper (not transformers' own) while use_cache is on",
    knobs=('use_cache', 'checkpoint_impl'),
    when=lambda s: s.checkpointing != "off" and s.use_cache and s.checkpoint_impl == "torch-wrapper",
    cause=("With config.use_cache=True the recomputed forward appends its keys and values to the KV cache a "
           "second time, so attention in backward reads stale keys: wrong gradients with no error, or a "
           "CheckpointError with a doubled sequence length. transformers' own checkpointing turns the cache off "
           "inside checkpointed layers; torch's checkpoint_wrapper does not."),
    fix="loraflow trains with use_cache=False.",
    remedy=lambda s: {"use_cache": False},
    elsewhere="set model.config.use_cache=False (or --use_cache false) for training",
    references=("https://github.com/huggingface/transformers/issues/28056",
                "https://github.com/huggingface/transformers/pull/30320"),
    fixed_in="transformers' own checkpointing forces it off; torch wrappers never will",
    symptoms=("zero-adapter-gradient",),
    log=LogSigns(
        messages=RECOMPUTE_MESSAGES + (RECOMPUTE_COUNT, Message(
            r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)", "generic",
            "attention over a cache of another length")),
        frames=RECOMPUTE_FRAMES,
        evidence=(Evidence("meta:cache-grown", 8, "a recomputed tensor grew along one dimension: the KV cache was "
                           "written a second time during recompute", decisive=True, alone=True),
                  *recompute_rivals("meta:cache-grown"),
                  Evidence("kv_cache", 2, "the KV cache appears in the log"),
                  Evidence("checkpoint_wrapper", 2, "torch's checkpoint_wrapper checkpoints outside transformers"),
                  Evidence("mismatch:doubled", 2, "one length is twice the other: a sequence written twice")),
        prior=2.0,
        tells_apart="use_cache is on during training with checkpointing applied outside transformers (torch's "
                    "checkpoint_wrapper, FSDP activation_checkpointing); a recomputed length twice the saved one"),
))

register(Rule(
    id="packing-cache-cross-attention",
    title="Packed samples attend to each other when the KV cache is on",
    verdict="fix",
    impact="silent",
    conditions="packed samples (restarting position ids, no attention mask) while use_cache is on",
    knobs=('use_cache', 'packing'),
    when=lambda s: s.packing and s.use_cache,
    cause=("transformers detects packed sequences from restarting position ids only when no cache is passed "
           "(masking_utils._preprocess_mask_arguments checks past_key_values is None). With use_cache=True the "
           "model creates a cache, the detection is skipped, and every packed sample attends to the ones before "
           "it: no error, wrong loss. Found while building loraflow's packing (logit error 0.17 on a 2-layer "
           "Llama)."),
    fix="loraflow trains with use_cache=False whenever data.packing is on.",
    remedy=lambda s: {"use_cache": False},
    elsewhere="pass use_cache=False in the training forward when packing with position_ids",
    references=("transformers/masking_utils.py: find_packed_sequence_indices",),
    fixed_in="not fixed upstream (transformers 5.23)",
))

register(Rule(
    id="no-adapter-matched",
    title="The adapter targets match no module of this model",
    verdict="error",
    impact="crash",
    conditions="adapter target names match zero modules of the model",
    knobs=('matched_modules',),
    when=lambda s: s.adapter != "full" and s.matched_modules == 0,
    cause=("The target module names match nothing in this model family (for example OPT's names on a Llama), "
           "so no adapter is created and nothing would train. PEFT refuses it (`Target modules ... not found in the "
           "base model`); LoRA implementations of their own (DeepSpeed-Chat's) go on and fail at the first backward "
           "with 'element 0 of tensors does not require grad'."),
    fix="Set adapter.target_modules to names this model has (loraflow check lists them), or all-linear.",
    elsewhere="fix --lora_target_modules / target_modules to this model's module names",
    references=("peft: NoMatchingPeftModuleError in tuners/tuners_utils.py",),
    fixed_in="design: refuse before training",
    symptoms=("no-gradient",),
    log=LogSigns(
        # PEFT prints `trainable params: 0` only after it created adapters (with none matched it raises first), so
        # that line belongs to adapter-loaded-frozen.
        messages=(Message(r"Target modules? .{0,400}not found in the base model", "own",
                          "peft inject_adapter (since 0.5; LoraModel._find_and_replace before); a list before peft "
                          "0.6, a set after; NoMatchingPeftModuleError from 0.21, ValueError before"),
                  Message(r"No modules were targeted for adaptation|All modules were excluded", "own",
                          "peft tuners_utils.py: inject_adapter (peft>=0.14)"),
                  Message(_NO_GRAD_FN, "shared", "torch autograd: run_backward")),
        evidence=(Evidence("no_target", 6, "PEFT found no module to adapt", decisive=True),
                  Evidence("adapter_loaded", -3, "a saved adapter is loaded, which points at its frozen loading"),
                  Evidence("reentrant_warning", -3, "torch's reentrant warning points at checkpointing instead"),
                  Evidence("checkpointing", -1, "checkpointing is in use, the more common cause")),
        prior=2.0,
        tells_apart="the target module names (e.g. OPT's `decoder.layers.` or `q_proj` on a model with `W_pack` or "
                    "`query_key_value`) do not exist in this model family"),
))

register(Rule(
    id="lora-no-default-targets",
    title="A LoRA config without target modules on a model type PEFT has no default for",
    verdict="error",
    impact="crash",
    conditions="a LoraConfig with no target_modules (TRL's --use_peft without --lora_target_modules) on a model "
               "whose config.model_type is not in the running PEFT release's default-target table",
    knobs=("no_default_targets",),
    when=lambda s: s.adapter != "full" and s.no_default_targets,
    cause=("With target_modules unset, PEFT looks the targets up by the model's config.model_type in a table of a "
           "few dozen architectures (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING) and refuses a type it does "
           "not list (`Please specify `target_modules` in `peft_config``): image-text models (Qwen2-VL, "
           "Qwen2.5-VL, Gemma 3, Llama 3.2 Vision), Phi-3, InternLM, Baichuan, remote-code models, and types "
           "added after the installed release (ChatGLM from 0.3.0, Qwen2 from 0.12.0, Qwen3 from 0.16.0)."),
    fix="Set adapter.target_modules (loraflow check lists the model's linear layers), or all-linear.",
    elsewhere="pass target_modules to LoraConfig (or --lora_target_modules): the model's attention/MLP projection "
              "names, or \"all-linear\" (peft >= 0.8)",
    references=("https://github.com/mymusise/ChatGLM-Tuning/issues/25",
                "https://github.com/baichuan-inc/Baichuan-13B/issues/52",
                "https://github.com/shibing624/MedicalGPT/issues/379",
                "https://github.com/MAGICS-LAB/DNABERT_2/issues/133"),
    fixed_in="design: PEFT defaults only the model types it lists",
    log=LogSigns(
        messages=(Message(r"Please specify `?target_modules`?(?: or `?target_parameters`?)?\s*in `?peft_config`?",
                          "own",
                          "peft _prepare_adapter_config of the LoRA model and of other tuners with a default table "
                          "(IA3, LoHa, OFT...); mapping.py _prepare_lora_config in 0.2; `or target_parameters` for "
                          "LoRA from 0.17"),),
        prior=1.0,
        tells_apart="PEFT's own refusal asks for target_modules: the config named none and the model type has no "
                    "default (a list that names the wrong layers is no-adapter-matched)"),
))


def _others_train(s: Combination) -> bool:
    """Weights beside the adapters train (a tower or projector, the head, the embeddings): a frozen adapter then
    fails nothing, it only never learns (rule adapter-frozen-others-train)."""
    return s.towers_trainable or s.lm_head_trainable or s.embeddings_trainable


register(Rule(
    id="adapter-loaded-frozen",
    title="The adapter is frozen when training starts (loaded for inference, or frozen again): nothing requires grad",
    verdict="fix",
    impact="crash",
    conditions="a saved adapter loaded with PeftModel.from_pretrained (or load_adapter) without is_trainable=True, "
               "then trained (resuming or continuing a LoRA fine-tune); or prepare_model_for_kbit_training called "
               "after get_peft_model",
    knobs=("adapter_loaded_frozen",),
    when=lambda s: s.adapter != "full" and s.adapter_loaded_frozen and not _others_train(s),
    cause=("PeftModel.from_pretrained loads an adapter for inference unless is_trainable=True: its weights come back "
           "with requires_grad=False, so `trainable params: 0`, and the first backward or optimizer step fails "
           "(`element 0 of tensors does not require grad`, fp16's `No inf checks were recorded for this optimizer`). "
           "peft's prepare_model_for_kbit_training starts by setting requires_grad=False on every parameter "
           "(peft utils/other.py), so called on a model that already has its adapters it freezes them the same way."),
    fix="loraflow resumes from its own checkpoints with the adapter trainable (and merges saved adapters it starts "
        "from into the base, model.merge_adapters).",
    remedy=lambda s: {"adapter_loaded_frozen": False},
    elsewhere="PeftModel.from_pretrained(base, path, is_trainable=True), or resume through the trainer's "
              "resume_from_checkpoint; call prepare_model_for_kbit_training before get_peft_model",
    references=("peft PeftModel.from_pretrained(is_trainable=False by default)",
                "https://github.com/huggingface/peft/issues/1142"),
    fixed_in="design (PEFT loads adapters for inference by default)",
    log=LogSigns(
        messages=(ZERO_TRAINABLE, Message(_NO_GRAD_FN, "shared", "torch autograd: run_backward"),
                  Message(r"No inf checks were recorded for this optimizer", "shared",
                          "torch/amp/grad_scaler.py: GradScaler.step (no parameter had a gradient)")),
        evidence=(Evidence("adapter_loaded", 5, "a saved adapter is loaded (from_pretrained, load_adapter, resume)",
                           decisive=True),
                  Evidence("no_target", -6, "PEFT found no module to adapt, which points elsewhere"),
                  Evidence("reentrant_warning", -3, "torch's reentrant warning points at checkpointing instead")),
        prior=1.5,
        tells_apart="the run continues from a saved adapter (PeftModel.from_pretrained without is_trainable=True, "
                    "or LoraConfig(inference_mode=True)); PEFT printed `trainable params: 0`, which it prints only "
                    "after creating adapters"),
))

register(Rule(
    id="tied-embedding-adapter",
    title="Training tied embeddings without keeping them tied",
    verdict="fix",
    impact="silent",
    conditions="tie_word_embeddings=True and embed_tokens or lm_head trained (adapted or modules_to_save) without "
               "ensure_weight_tying",
    knobs=('weight_tying_enforced',),
    # A copy exists only beside an adapter: full fine-tuning (Axolotl's unfrozen_parameters naming embed_tokens)
    # trains the one shared matrix in place, which stays tied.
    when=lambda s: (s.tied_embeddings and (s.embeddings_trainable or s.lm_head_trainable)
                    and s.adapter != "full" and not s.weight_tying_enforced),
    cause=("With tie_word_embeddings=True, embed_tokens and lm_head share one matrix. Training a copy of one of "
           "them (modules_to_save) unties them; where a reload or export re-ties them, the trained lm_head is "
           "silently lost. (On peft 0.21.2 + transformers 5.23 `loraflow probe` finds both PEFT reload paths "
           "intact; PEFT still warns for merging and other export formats.)"),
    fix="loraflow passes ensure_weight_tying=True to PEFT so the trained copies stay tied (PEFT >= 0.18).",
    remedy=lambda s: {"weight_tying_enforced": True},
    elsewhere="LoraConfig(ensure_weight_tying=True), or untie the embeddings explicitly",
    references=("https://github.com/huggingface/peft/pull/2803", "https://github.com/huggingface/peft/pull/2879"),
    fixed_in="peft 0.18.0 (modules_to_save), 0.19.0 (target_modules), opt-in",
    log=LogSigns(
        messages=(Message(r"Model with `?tie_word_embeddings=True`? and the tied_target_modules", "warning",
                          "peft tuners_utils.py: merge_and_unload warns that tied embeddings are part of the adapter"),
                  TIED_OUTPUT_LORA),  # torchtune's refusal of LoRA on a tied output (refusals.py)
        tells_apart="embed_tokens or lm_head trained (modules_to_save or targets) on a model whose config ties them"),
))

register(Rule(
    id="checkpointing-off-in-eval",
    title="Checkpointed layers in eval mode silently stop checkpointing",
    verdict="fix",
    impact="slow",
    conditions="transformers' layer checkpointing on, trained model left in eval mode (e.g. after generate) when "
               "the loss is computed",
    knobs=("train_mode_at_backward",),
    when=lambda s: s.checkpointing != "off" and s.checkpoint_impl == "transformers" and not s.train_mode_at_backward,
    cause=("transformers' GradientCheckpointingLayer only recomputes when the layer is in training mode "
           "(modeling_layers.py checks `self.gradient_checkpointing and self.training`). A policy left in eval mode "
           "after generation keeps every activation: no error, the memory saving is gone (and dropout is off)."),
    fix="loraflow puts the model in train mode before every loss and asserts it before backward.",
    remedy=lambda s: {"train_mode_at_backward": True},
    elsewhere="call model.train() after generation, before computing the loss",
    references=("transformers/modeling_layers.py: GradientCheckpointingLayer.__call__",
                "https://github.com/huggingface/diffusers/issues/9850",
                "https://github.com/victorchall/EveryDream2trainer/pull/246"),
    symptoms=("eval-mode-at-backward",),
    fixed_in="design (checkpointing is tied to module.training)",
))

register(Rule(
    id="fp16-trainable-unscale",
    title="Trainable weights stored in fp16 cannot be unscaled by the GradScaler",
    verdict="fix",
    impact="crash",
    conditions="pure fp16 storage of the trainable parameters (adapters or modules_to_save) with fp16 loss scaling",
    knobs=("precision",),
    when=lambda s: s.precision == "fp16" and s.grad_scaler,
    cause=("fp16 mixed precision scales the loss and unscales gradients before the optimizer step; torch's "
           "GradScaler refuses fp16 gradients because unscaling them in fp16 overflows. Trainable weights cast to "
           "fp16 (model.half(), autocast_adapter_dtype=False, fp16 modules_to_save) therefore crash at the first "
           "clip or step."),
    fix="loraflow keeps every trainable parameter in fp32 (precision *-mixed) and only the frozen base in half.",
    remedy=lambda s: {"precision": "fp16-mixed"},
    elsewhere="keep adapters in fp32: get_peft_model(..., autocast_adapter_dtype=True) (PEFT's default), and do "
              "not cast modules_to_save to fp16",
    references=("torch/amp/grad_scaler.py: GradScaler._unscale_grads_",
                "https://github.com/huggingface/transformers/issues/30559",
                "https://github.com/axolotl-ai-cloud/axolotl/issues/1031",
                "https://github.com/huggingface/diffusers/pull/6119"),
    fixed_in="design (PEFT's get_peft_model keeps adapters in fp32 by default: autocast_adapter_dtype=True)",
    log=LogSigns(
        messages=(Message(r"Attempting to unscale FP16 gradients", "own",
                          "torch/amp/grad_scaler.py: GradScaler._unscale_grads_"),),
        frames=(Message(r"grad_scaler\.py:(_unscale_grads_|unscale_)$|accelerator\.py:unscale_gradients$", "own"),),
        evidence=(Evidence("half", 1, "half precision is in use"),)),
))


register(Rule(
    id="bf16-lost-updates",
    title="Pure bf16 full fine-tuning, DoRA or a tower trained in full rounds most weight updates away",
    verdict="error",
    impact="silent",
    conditions="pure bf16 (the trained weights stored in bfloat16, no fp32 master copy) with full fine-tuning, DoRA, "
               "or an image-text model's vision encoder or projector trained in full",
    knobs=("precision", "adapter", "towers_full"),
    when=lambda s: s.precision == "bf16" and (s.adapter in ("full", "dora") or s.towers_full),
    cause=("bfloat16 keeps 8 significant bits: a weight w moves only when its update exceeds about |w| / 256. "
           "Adam's update is about the learning rate, so at 1e-5 every weight larger than 0.003 (the norms at 1.0, "
           "most of the matrices) stays where it was, and at 1e-3 the norm weights still never move. The run "
           "trains without an error and its loss falls through the weights small enough to move; the composition "
           "sweep found norm weights bit-identical after 3 steps at 1e-3, a DoRA magnitude (a weight row's "
           "norm, of order 1), and the layer norms of a vision encoder trained in full beside LoRA. LoRA's A and "
           "B are spared because they are small and B starts at zero."),
    fix="loraflow refuses it: use precision.mode=bf16-mixed (fp32 trained weights and optimizer state, bf16 "
        "compute), or train LoRA adapters (adapter.method=lora; towers.vision.train=adapter)",
    elsewhere="keep fp32 master weights (mixed precision), or an optimizer with stochastic rounding or Kahan "
              "summation for bf16 weights",
    references=("https://arxiv.org/abs/1905.12322 (A Study of BFLOAT16 for Deep Learning Training: updates below "
                "the weight's precision are lost without fp32 master weights)",
                "https://github.com/pytorch/ao/tree/main/torchao/optim (bf16_stochastic_round for this reason)"),
    fixed_in="design (bfloat16's 8-bit significand)",
    log=LogSigns(),
))

register(Rule(
    id="adapter-omits-new-head",
    title="A reward model's new head left out of its LoRA adapter",
    verdict="fix",
    impact="silent",
    conditions="a reward (sequence-classification) model trained with LoRA whose score or value head, created for "
               "the task, is neither trained in full beside the adapters nor saved with them",
    knobs=("task_head_saved", "adapter"),
    when=lambda s: s.score_head and s.adapter != "full" and not s.task_head_saved,
    cause=("The reward model's head is new: a random linear layer added on top of the language model. An adapter "
           "that holds only the LoRA weights leaves that head frozen at its random initialization during training, "
           "or trains it and does not save it; either way, loading the adapter on the base model, or merging it, "
           "builds a fresh random head, and the rewards that steer the next stage are not the trained ones, with "
           "no error."),
    fix="loraflow trains the reward model's score head in full and saves it with the adapter (PEFT "
        "modules_to_save), and reward_model.json names it.",
    remedy=lambda s: {"task_head_saved": True},
    elsewhere="put the head in the LoRA config's modules_to_save (PEFT does so for task_type SEQ_CLS), and load the "
              "adapter on AutoModelForSequenceClassification, not the causal-LM class",
    references=("https://github.com/OpenRLHF/OpenRLHF/issues/873", "https://github.com/OpenRLHF/OpenRLHF/pull/1342",
                "https://github.com/huggingface/trl/issues/368", "https://github.com/modelscope/ms-swift/issues/6099"),
    fixed_in="design",
    log=LogSigns(
        messages=(Message(r"newly initialized: \[[^\]]*'(score|value_head|v_head|classifier)\.weight'", "generic",
                          "transformers/modeling_utils.py: loading a sequence-classification model whose head the "
                          "checkpoint lacks"),),
        evidence=(Evidence("peft", 2, "the model was trained with an adapter"),
                  Evidence("load", 2, "a trained model or adapter is loaded"),
                  Evidence("rlhf", 1, "a reward model feeds an RL stage")),
        prior=0.5,
        tells_apart="transformers reports the head as newly initialized when the trained reward model is loaded"),
))

TRL_REFUSES_PEFT_MODEL_WITH_CONFIG = "0.27.0"
"""TRL's trainers refuse a PeftModel given together with a peft_config from 0.27.0 (PR #4713). Before, SFT merged
and unloaded the model's adapter first (0.20 - 0.26), or kept the PeftModel and ignored the new config (0.13 -
0.19): a fresh adapter's merge changes nothing, so the common script ran."""

register(Rule(
    id="peft-config-on-peft-model",
    title="A PeftModel handed to TRL's trainer together with a peft_config",
    verdict="error",
    impact="crash",
    conditions="a TRL trainer (SFT, DPO, GRPO, RLOO, reward) given a model the script already wrapped with PEFT "
               "(get_peft_model, PeftModel.from_pretrained) and a peft_config too, TRL >= 0.27",
    knobs=("peft_config_on_peft_model",),
    affected={"trl": f">={TRL_REFUSES_PEFT_MODEL_WITH_CONFIG}"},
    when=lambda s: s.peft_config_on_peft_model,
    cause=("The trainer builds its adapter from peft_config itself. Given a model that is already a PeftModel it "
           "would have to merge the first adapter into the base to add the second, and the saved adapter would then "
           "need a merged base that is never saved; TRL 0.27 refuses the pair at construction instead "
           "(`You passed a PeftModel instance together with a peft_config to the trainer`)."),
    fix="Pass one of them: the base model with peft_config (let the trainer wrap it), or the PeftModel without "
        "peft_config; to train a new adapter on top of a trained one, merge_and_unload it, save that base, and "
        "train from it.",
    elsewhere="drop get_peft_model(...) before the trainer when peft_config is passed, or drop peft_config=",
    references=("https://github.com/huggingface/trl/pull/4713",),
    fixed_in="not a bug: TRL's contract since 0.27.0",
    log=LogSigns(
        messages=(Message(r"You passed a `?PeftModel`? instance together with a `?peft_config`?", "own",
                          "trl/trainer/sft_trainer.py, dpo_trainer.py, grpo_trainer.py: __init__ (trl>=0.27.0)"),),
        prior=1.0,
        tells_apart="TRL's own refusal names the PeftModel and the peft_config"),
))

register(Rule(
    id="adapter-frozen-others-train",
    title="The adapter is frozen while other weights train: it never learns",
    verdict="fix",
    impact="silent",
    conditions="the adapter frozen as training starts (loaded for inference, or frozen again after get_peft_model: "
               "LLaVA-NeXT's --mm_tunable_parts without mm_language_model) while other weights train (a vision "
               "tower or projector, the head, the embeddings)",
    knobs=("adapter_loaded_frozen",),
    when=lambda s: s.adapter != "full" and s.adapter_loaded_frozen and _others_train(s),
    cause=("With some weights still requiring grad the step runs and the loss falls, carried by the parts that "
           "train, while the adapter's weights never change: the saved adapter is its initialization (LoRA's B is "
           "zero, so it changes nothing), and a run that looks healthy has not adapted the language model."),
    fix="loraflow resumes from its own checkpoints with the adapter trainable, and sets what trains from the "
        "towers and targets it is given.",
    remedy=lambda s: {"adapter_loaded_frozen": False},
    elsewhere="set the adapter trainable after choosing what else trains (PeftModel.from_pretrained(..., "
              "is_trainable=True); in LLaVA-NeXT, name mm_language_model in --mm_tunable_parts or drop --lora_enable)",
    references=("https://github.com/LLaVA-VL/LLaVA-NeXT/blob/main/llava/train/train.py (mm_tunable_parts: "
                "model.requires_grad_(False) after get_peft_model)", "https://github.com/huggingface/peft/issues/1142"),
    fixed_in="design",
))
