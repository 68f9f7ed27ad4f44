"""Unsloth's in-process vLLM engine (FastLanguageModel.from_pretrained(fast_inference=True)) as the RL trainers of a
training script use it: which rollout engine samples, how the adapter reaches it, and the engine's limits.

Unsloth rewrites TRL's RL trainers when it is imported (unsloth/models/rl.py, _patch_trl_rl_trainers):
- `__init__` gains `if hasattr(model, 'vllm_engine') and hasattr(args, 'use_vllm'): args.use_vllm = True` (and
  `args.vllm_mode = 'colocate'` from TRL 0.18), so a model loaded with fast_inference=True samples through vLLM
  whatever the config says;
- `self.llm` becomes `model.vllm_engine`, the engine Unsloth started inside the training process
  (unsloth_zoo/vllm_utils.py load_vllm(enable_lora=True, max_lora_rank=...)) on gpu_memory_utilization of the GPU;
- every `self.llm.generate(...)` gains `lora_request = self.model.load_lora(..., load_tensors = True)`, and the weight
  loading TRL does (`load_weights(model.state_dict())`) is replaced by `pass`: the engine serves the base weights it
  loaded and the trained adapter is handed over as a LoRA request at each generation.
vLLM refuses an adapter whose rank is above the engine's max_lora_rank (`LoRA rank 32 is greater than
max_lora_rank 16.`) and any max_lora_rank outside its own list; Unsloth passes from_pretrained's max_lora_rank
through (64 unless given, unsloth/models/loader.py FastLanguageModel.from_pretrained, since the first releases with
fast_inference, 2025.2) and does not compare it with get_peft_model's r.
"""

from __future__ import annotations

from loraflow.frontends import trl as trl_rel
from loraflow.frontends.common import Draft, as_bool
from loraflow.frontends.hf_options import Opt
from loraflow.frontends.script_code import Call, Code
from loraflow.frontends.script_facts import Facts, kind

MAX_LORA_RANK_DEFAULT = 64
"""FastLanguageModel.from_pretrained(max_lora_rank=64) (unsloth/models/loader.py; FastLlamaModel's own 16 is not
what a user reaches through FastLanguageModel)."""
GPU_SHARE_DEFAULT = 0.5
"""FastLanguageModel.from_pretrained(gpu_memory_utilization=0.5) (unsloth/models/loader.py)."""


def engine_load(code: Code, facts: Facts) -> Call | None:
    """The Unsloth load that starts vLLM in the training process (fast_inference=True), when the script trains with
    one of TRL's trainers that sample with vLLM."""
    if facts.trainer_key not in trl_rel.VLLM_TRAINERS:
        return None
    for call in code.calls:
        if kind(call, code) != "unsloth_load" or not code.always_runs(call):
            continue
        if facts.trained_at and call.line > facts.trained_at:
            continue  # a load after training is for inference
        fast = call.kwargs.get("fast_inference", False)
        if fast is True or (isinstance(fast, str) and as_bool(fast, call.at("fast_inference"))):
            return call
    return None


def vllm_options(code: Code, facts: Facts, opts: dict[str, Opt]) -> None:
    """use_vllm and vllm_mode as Unsloth's patched trainer sets them on a model with a vllm_engine: on, colocated,
    whatever the config said (a use_vllm=False there is overridden too)."""
    load = engine_load(code, facts)
    if load is None:
        return
    why = (f"{load.at('fast_inference')} (Unsloth's patched {facts.trainer_key} trainer sets use_vllm=True for a "
           "model with a vllm_engine, unsloth/models/rl.py)")
    opts["use_vllm"] = Opt(True, why)
    opts["vllm_mode"] = Opt("colocate", f"{load.at('fast_inference')} (Unsloth samples with the vLLM engine it "
                                        "started in the training process, model.vllm_engine)")


def vllm_rollouts(draft: Draft, code: Code, facts: Facts) -> None:
    """After TRL's rollout fields: what Unsloth's rewrite of the trainer changes (the adapter as a LoRA request, the
    engine's max_lora_rank and GPU share from from_pretrained)."""
    load = engine_load(code, facts)
    if load is None or draft.get("rollout_engine") != "vllm":
        return
    where = load.at("fast_inference")
    if draft.get("adapter") != "full":
        draft.set("rollout_sync", "adapter", f"{where} (Unsloth hands the trained adapter to its vLLM engine as a "
                  "LoRA request at every generation: model.load_lora(load_tensors=True), unsloth/models/rl.py)")
        draft.set("merge_into_quantized", False, f"{where} (Unsloth never merges the adapter for generation)")
        draft.set("rollout_sync_proven", True, f"{where} (the adapter's current tensors go with each generate call)")
    # The engine is in the training process, but the trainer's base weights are the engine's own tensors
    # (unsloth_zoo/vllm_utils.py builds the training model from vLLM's weights) and Unsloth shrinks the requested
    # share to leave room for training (approximate_vllm_memory_usage(account_for_gradients=True): the notebooks'
    # 0.9 starts vLLM with "actual GPU utilization = 59.43%"): not two copies claiming one GPU.
    draft.set("rollout_colocated", False, f"{where} (Unsloth's vLLM engine shares the trained model's weights and "
              "sizes its own share of the GPU, unsloth_zoo/vllm_utils.py)")
    computed = next((c for c in facts.configs + facts.wraps if "r" in c.kwargs and
                     (not isinstance(c.kwargs["r"], int) or isinstance(c.kwargs["r"], bool))), None)
    if computed is not None and draft.get("adapter") != "full":  # only vLLM's rank limit reads it
        draft.unknown.append(f"{computed.at('r')} (computed: the adapter's rank is not compared with the engine's "
                             "max_lora_rank)")
    rank = load.kwargs.get("max_lora_rank", MAX_LORA_RANK_DEFAULT)
    if isinstance(rank, int) and not isinstance(rank, bool):
        said = (load.at("max_lora_rank") if "max_lora_rank" in load.kwargs else
                f"default ({load.at()}: Unsloth starts vLLM with max_lora_rank={MAX_LORA_RANK_DEFAULT}, "
                "unsloth/models/loader.py)")
        draft.set("engine_max_lora_rank", rank, said)
    else:
        draft.unknown.append(f"{load.at('max_lora_rank')} (not a literal: the engine's max_lora_rank is not visible)")
    share = load.kwargs.get("gpu_memory_utilization", GPU_SHARE_DEFAULT)
    if isinstance(share, (int, float)) and not isinstance(share, bool):
        said = (load.at("gpu_memory_utilization") if "gpu_memory_utilization" in load.kwargs else
                f"default ({load.at()}: gpu_memory_utilization={GPU_SHARE_DEFAULT}, unsloth/models/loader.py)")
        draft.set("engine_gpu_memory_utilization", float(share), said + " (the share Unsloth starts from)")


def vision_tower_hook(draft: Draft, facts: Facts) -> None:
    """FastVisionModel / FastModel.get_peft_model: without target_modules (or with "all-linear") Unsloth picks the
    linear layers itself, the vision tower's included unless finetune_vision_layers=False (get_peft_regex, unsloth_zoo/
    peft_utils.py). It ends with requires_grad_for_gradient_checkpointing (unsloth/models/vision.py, since the first
    vision release's FastBaseVisionModel), which hooks the input of the part of the model that holds the first
    trainable parameter (the tower's, when it has adapters; a CLIP / SigLIP tower's input embeddings), so the
    tower's reentrant-checkpointed blocks build a graph whatever transformers' enable_input_require_grads marks."""
    wrap = next((c for c in facts.wraps if c.owner_name.rsplit(".", 1)[-1] in ("FastVisionModel", "FastModel")), None)
    if wrap is None or not facts.unsloth_vision or wrap.splat:
        return
    targets = wrap.kwargs.get("target_modules")
    if draft.get("image_text") and targets in (None, "all-linear") and wrap.kwargs.get(
            "finetune_vision_layers", True) is True and not draft.get("tower_adapters"):
        said = f"{wrap.at('finetune_vision_layers')} (Unsloth puts adapters on the vision tower's linear layers " \
               "unless finetune_vision_layers=False, get_peft_regex in unsloth_zoo/peft_utils.py)"
        draft.set("tower_adapters", True, said)
        draft.set("towers_trainable", True, said)
        draft.set("targets_all_towers", False, f"{wrap.at()} (Unsloth's regex picks only linear layers PEFT wraps)")
    if draft.get("tower_adapters") and draft.get("checkpointing") != "off":
        draft.set("tower_input_hook", True, f"{wrap.at()} (Unsloth's requires_grad_for_gradient_checkpointing hooks "
                  "the input of the tower that holds the first trainable weights, unsloth_zoo/peft_utils.py)")


def precision_against_load(draft: Draft, code: Code, facts: Facts) -> None:
    """The trainer's fp16/bf16 against the dtype Unsloth loads the model in (rule unsloth-precision-mismatch):
    `dtype=None` is bfloat16 on a GPU that supports it, float16 on a T4 or V100 (unsloth/models/loader.py)."""
    load = next((c for c in code.calls if kind(c, code) == "unsloth_load" and code.always_runs(c) and
                 (not facts.trained_at or c.line < facts.trained_at)), None)
    precision = draft.get("precision")
    # Only the TRL trainers Unsloth compiles (UnslothSFTTrainer...) check; transformers' own Trainer does not.
    if load is None or not facts.trainer_key or draft.get("adapter") == "full" or precision not in (
            "fp16-mixed", "bf16-mixed"):
        return
    key = "dtype" if "dtype" in load.kwargs else "torch_dtype"
    dtype = load.kwargs.get(key)
    if precision == "bf16-mixed":
        if dtype == "float16":
            draft.set("precision_against_load", True, f"{load.at(key)} (float16) with bf16 training")
        return
    if dtype == "bfloat16":
        draft.set("precision_against_load", True, f"{load.at(key)} (bfloat16) with fp16 training")
    elif dtype is None:
        draft.maybe("precision_against_load", {
            True: "the GPU supports bfloat16: Unsloth loads the model in bfloat16 (dtype=None)",
            False: "a GPU without bfloat16 (T4, V100): Unsloth loads the model in float16"},
            f"{load.at()}: dtype=None loads in bfloat16 where the GPU supports it, and the trainer asks for fp16")
