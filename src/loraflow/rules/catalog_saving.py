"""The rules of what a save writes: an engine checkpoint that holds only what the optimizer owns, an adapter file
filtered twice into nothing, an FSDP2 checkpoint that holds one rank's slice of the adapter, and an adapter whose
resized embeddings no longer fit the base it is loaded onto.
(ZeRO-3 adapter partitions saved without a gather: catalog_sharded.py, zero3-empty-adapter-save; a new head left out
of the adapter: catalog.py, adapter-omits-new-head.)"""

from __future__ import annotations

from loraflow.rules.rule import Rule, register
from loraflow.rules.signs import Evidence, LogSigns, Message

register(Rule(
    id="zero3-checkpoint-frozen",
    title="A ZeRO-3 checkpoint leaves out the frozen weights",
    verdict="fix",
    impact="silent",
    conditions="DeepSpeed ZeRO-3, frozen weights (adapters, frozen towers or layers), and frozen weights restored "
               "from DeepSpeed's own checkpoint (load_checkpoint to resume, zero_to_fp32 to consolidate), "
               "deepspeed < 0.9.1",
    knobs=("frozen_from_engine_checkpoint",),
    affected={"deepspeed": "<0.9.1"},
    when=lambda s: s.zero3 and s.frozen_params and s.frozen_from_engine_checkpoint,
    cause=("A DeepSpeed checkpoint stores the optimizer's partitions of the trained weights; the module state it "
           "writes under ZeRO-3 holds [0] placeholders. Before 0.9.1 nothing else recorded the frozen weights, so "
           "zero_to_fp32 rebuilt a state dict without them and a resumed run kept whatever its frozen weights were "
           "initialized to: random for layers built from a config, missing keys for a LoRA base."),
    fix="loraflow restores frozen weights from the pretrained model they were frozen from, and keeps only the "
        "trained state in DeepSpeed's checkpoint (exclude_frozen_parameters).",
    remedy=lambda s: {"frozen_from_engine_checkpoint": False},
    elsewhere="deepspeed >= 0.9.1 (frozen partitions saved and rebuilt by zero_to_fp32); else reload the base "
              "weights from the pretrained model before loading the checkpoint, or save the adapter or the "
              "gathered 16-bit model (stage3_gather_16bit_weights_on_model_save) rather than consolidating",
    references=("https://github.com/deepspeedai/DeepSpeed/pull/3205",
                "https://github.com/deepspeedai/DeepSpeed/issues/3090",
                "https://github.com/deepspeedai/DeepSpeed/issues/3291",
                "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/runtime/engine.py "
                "(_save_checkpoint: frozen_param_shapes, frozen_param_fragments)"),
    fixed_in="0.9.1",
    log=LogSigns(
        messages=(Message(r"[\w.]+\.(weight|bias)\W{1,6}torch\.Size\(\[0\]\)", "generic",
                          "a ZeRO-3 checkpoint's module states: weights saved as [0] placeholders"),
                  Message(r"Missing key\(s\) in state_dict", "generic",
                          "load_state_dict of a state dict zero_to_fp32 rebuilt without the frozen weights")),
        evidence=(Evidence("ds_checkpoint", 4, "a DeepSpeed checkpoint is read or consolidated", decisive=True),
                  Evidence("zero3", 2, "ZeRO-3 is in use")),
        prior=1.0,
        tells_apart="DeepSpeed's own checkpoint files or zero_to_fp32 beside [0]-shaped or missing weights"),
))


def _keeps_frozen(s) -> bool:
    kept = s.engine_checkpoints == "all" or (s.engine_checkpoints == "peft-trainable" and s.adapter == "full")
    return s.engine_spec.zero and s.frozen_params and kept


register(Rule(
    id="zero-checkpoint-frozen-base",
    title="Every DeepSpeed checkpoint of an adapter run stores the whole frozen base",
    verdict="fix",
    impact="slow",
    conditions="DeepSpeed, frozen weights, and resumable engine checkpoints saved without "
               "exclude_frozen_parameters: the HF Trainer before transformers 4.37, or from 4.37 for frozen weights "
               "of a model that is not a PeftModel (freeze-tuning, frozen towers); OpenRLHF's save_ckpt",
    knobs=("engine_checkpoints",),
    when=_keeps_frozen,
    cause=("DeepSpeed's save_checkpoint writes the module's whole state dict beside the optimizer's partitions: "
           "with ZeRO-1/2 every frozen base weight in 16-bit in mp_rank_00_model_states.pt (and, since 0.9.1, "
           "again as frozen_param_fragments, a second copy on a GPU), with ZeRO-3 each rank's shard of them. A "
           "7B LoRA run writes about 14-28 GB per checkpoint for an adapter of under 0.1 GB, every save_steps, "
           "until the disk fills. exclude_frozen_parameters (DeepSpeed 0.10.1) leaves them out; the base is "
           "reloaded from the pretrained model on resume."),
    fix="loraflow's checkpoints keep only the trained state; the frozen base is reloaded from the pretrained "
        "model.",
    remedy=lambda s: {"engine_checkpoints": "trainable"},
    elsewhere="transformers >= 4.38 with a PEFT model (the Trainer passes exclude_frozen_parameters and resumes "
              "non-strictly); in your own loop engine.save_checkpoint(dir, exclude_frozen_parameters=True) and "
              "load_checkpoint(dir, load_module_strict=False) (accelerate: pass both through save_state / "
              "load_state; Lightning >= 2.5.5: DeepSpeedStrategy(exclude_frozen_parameters=True)); or "
              "save_only_model",
    references=("https://github.com/deepspeedai/DeepSpeed/pull/3953",
                "https://github.com/deepspeedai/DeepSpeed/issues/3437",
                "https://github.com/Lightning-AI/pytorch-lightning/issues/20949",
                "https://github.com/Lightning-AI/pytorch-lightning/pull/21060",
                "https://github.com/huggingface/transformers/pull/27825"),
    fixed_in="transformers 4.37.0 for PEFT models (4.38.0 to resume); DeepSpeed 0.10.1 has the option",
))

register(Rule(
    id="zero-peft-resume-strict",
    title="transformers 4.37 cannot resume its own DeepSpeed checkpoint of a PEFT model",
    verdict="error",
    impact="crash",
    conditions="the HF Trainer of transformers 4.37.x under DeepSpeed with a PEFT adapter, resuming from one of its "
               "checkpoints (resume_from_checkpoint, load_best_model_at_end)",
    knobs=("resumes",),
    affected={"transformers": ">=4.37.0,<4.38.0"},
    when=lambda s: (s.engine_spec.zero and s.adapter != "full" and s.engine_checkpoints == "peft-trainable"
                    and s.resumes),
    cause=("transformers 4.37 began saving a PEFT model's DeepSpeed checkpoints without the frozen weights "
           "(exclude_frozen_parameters=True) but still loaded them with load_module_strict=True, so resuming "
           "stops in load_checkpoint with `Missing key(s) in state_dict` naming every base weight; 4.38 loads "
           "PEFT checkpoints non-strictly (PR #28746)."),
    fix="loraflow resumes from its own checkpoints, which reload the frozen base from the pretrained model.",
    elsewhere="transformers >= 4.38.0; else resume by loading the adapter (PeftModel.from_pretrained(..., "
              "is_trainable=True)) instead of resume_from_checkpoint",
    references=("https://github.com/huggingface/transformers/pull/27825",
                "https://github.com/huggingface/transformers/pull/28746"),
    fixed_in="transformers 4.38.0",
    log=LogSigns(
        # What is missing is the PEFT model's base (`base_model.model.`): an adapter-only checkpoint loaded strictly.
        messages=(Message(r"Missing key\(s\) in state_dict: \"?base_model\.model\.", "shared",
                          "torch load_state_dict from DeepSpeed load_checkpoint (load_module_strict=True)"),
                  Message(r"Missing key\(s\) in state_dict", "generic",
                          "torch load_state_dict from DeepSpeed load_checkpoint (load_module_strict=True)")),
        evidence=(Evidence("deepspeed", 2, "DeepSpeed loads the checkpoint (the Trainer's deepspeed_load_checkpoint)"),
                  Evidence("peft", 2, "the model is a PEFT model")),
        prior=1.0,
        tells_apart="transformers 4.37.x, a PEFT model and resume_from_checkpoint under DeepSpeed (the missing keys "
                    "are the base model's, under base_model.model.)"),
))

register(Rule(
    id="adapter-state-dict-patched",
    title="A patched state_dict makes PEFT save an empty adapter",
    verdict="fix",
    impact="silent",
    conditions="the training script replaces model.state_dict with PEFT's adapter state dict (alpaca-lora's "
               "finetune.py and scripts copied from it), 0.3.0 <= peft < 0.20.0",
    knobs=("state_dict_patched",),
    affected={"peft": ">=0.3.0,<0.20.0"},
    when=lambda s: s.adapter != "full" and s.state_dict_patched,
    cause=("alpaca-lora's script replaces model.state_dict by get_peft_model_state_dict(model, old_state_dict()), "
           "which already strips each key's adapter name. From 0.3.0 to 0.19 PEFT's save_pretrained calls "
           "get_peft_model_state_dict itself and keeps only LoRA keys holding the adapter name, of which the patched "
           "dict has none: every checkpoint's adapter file is a few hundred bytes, and the reloaded model is the "
           "base model. The crash, if any, comes only at load (a size mismatch)."),
    fix="loraflow saves adapters with PEFT's own save_pretrained and never replaces a model's state_dict.",
    remedy=lambda s: {"state_dict_patched": False},
    elsewhere="delete the `model.state_dict = (lambda self, *_, **__: get_peft_model_state_dict(...))` lines of the "
              "script and save with model.save_pretrained; peft >= 0.20 no longer filters the patched dict again",
    references=("https://github.com/huggingface/peft/issues/286",
                "https://github.com/huggingface/transformers/issues/24551",
                "https://github.com/huggingface/peft/issues/580",
                "https://github.com/tloen/alpaca-lora/blob/main/finetune.py (the state_dict patch)",
                "https://github.com/huggingface/peft/pull/3282 (the second adapter-name filter dropped, peft 0.20.0)"),
    fixed_in="peft 0.20.0 (PR #3282; the patch itself is the script's)",
    log=LogSigns(
        # `ls -l` / `ls -lh` of a checkpoint whose adapter file is under 10 kB: an adapter holding no tensors.
        messages=(Message(r"\s(\d{1,4}|\d(\.\d)?K)\s+[A-Z][a-z]{2}\s+\d{1,2}\s+(\d{1,2}:\d{2}|\d{4})\s+"
                          r"adapter_model\.(bin|safetensors)\b", "shared",
                          "a directory listing showing an adapter file of a few hundred bytes"),),
        evidence=(Evidence("zero3", -6, "ZeRO-3 is in use: an ungathered save (rule zero3-empty-adapter-save) "
                                        "empties the adapter too"),),
        prior=0.5,
        tells_apart="an adapter file of a few hundred bytes without ZeRO-3; the script has alpaca-lora's "
                    "`model.state_dict = ...get_peft_model_state_dict...` lines"),
))


# accelerate utils/fsdp_utils.py _get_model_state_dict / _set_model_state_dict: the adapter_only branch returned PEFT's
# state dict before the FULL_STATE_DICT options were applied from 1.7.0 (PR #3527, FSDP2 + FULL allowed) until PR
# #4206 (1.15.0); ranks other than 0 load nothing (an early return to 1.8.1, an empty dict from 1.9.0, PR #3671).
ADAPTER_ONLY_FULL_FSDP2 = ">=1.7.0,<1.15.0"

register(Rule(
    id="fsdp2-adapter-resume-lost",
    title="Resuming an FSDP2 adapter run restores only rank 0's slice of the adapter",
    verdict="error",
    impact="silent",
    conditions="FSDP2 with FULL_STATE_DICT checkpoints, an adapter, more than one process, the HF Trainer's "
               "adapter-only FSDP checkpoints (transformers >= 4.38; TRL, LLaMA-Factory, axolotl, ms-swift on it), "
               "accelerate 1.7.0 - 1.14.x, and the run resumes from one of its checkpoints or reloads its best one "
               "(load_best_model_at_end); transformers >= 5.10 makes `--fsdp` FSDP2 with FULL_STATE_DICT by default",
    knobs=("fsdp_state_dict", "resumes"),
    affected={"accelerate": ADAPTER_ONLY_FULL_FSDP2},
    when=lambda s: (s.adapter != "full" and s.dtensor_params and s.world_size > 1 and s.fsdp_state_dict == "full"
                    and s.checkpoint_adapter_only and s.resumes),
    cause=("The Trainer saves each checkpoint's model state with accelerate's save_fsdp_model(adapter_only=True). "
           "For a PEFT model accelerate 1.7 - 1.14 returns PEFT's adapter state dict before applying the "
           "FULL_STATE_DICT gather, so rank 0 writes its own DTensor shards: pytorch_model_fsdp.bin holds 1/N of "
           "every lora_A and lora_B. On resume (or load_best_model_at_end) only rank 0 loads it, into its own slice; "
           "the other ranks load nothing, so (N-1)/N of the adapter keeps its initial values (lora_B zero, lora_A "
           "random) and training goes on from there with no warning; the loss jumps back up. The "
           "adapter_model.safetensors written at the end is gathered correctly, but after such a resume it holds "
           "the reset slices."),
    fix="loraflow saves and resumes adapters through its own gathered checkpoint, not accelerate's FSDP helpers.",
    elsewhere="accelerate >= 1.15.0 (PR #4206); else SHARDED_STATE_DICT checkpoints (fsdp_config "
              "state_dict_type SHARDED_STATE_DICT), or resume from a gathered adapter_model.safetensors instead of "
              "the checkpoint's FSDP file, and leave load_best_model_at_end off",
    references=("https://github.com/huggingface/accelerate/pull/4206",
                "https://github.com/huggingface/accelerate/pull/3527",
                "https://github.com/huggingface/accelerate/pull/3671",
                "https://github.com/huggingface/accelerate/blob/v1.14.0/src/accelerate/utils/fsdp_utils.py "
                "(_get_model_state_dict: the adapter_only branch returns before sd_options)",
                "https://github.com/huggingface/transformers/blob/v5.10.0/src/transformers/training_args.py "
                "(fsdp version 2 and FULL_STATE_DICT by default)"),
    fixed_in="accelerate 1.15.0",
))


register(Rule(
    id="adapter-vocab-mismatch",
    title="The adapter's resized embeddings do not fit the base it is loaded onto",
    verdict="error",
    impact="crash",
    conditions="an adapter saved with embedding / output-head rows for a resized vocabulary (added tokens; "
               "modules_to_save or save_embedding_layers) loaded with PeftModel.from_pretrained onto a base of "
               "another vocabulary size (not resized first), or PEFT 0.8.0 - 0.14.x's AutoPeftModel shrinking a "
               "padded embedding to the tokenizer's length",
    knobs=("adapter_vocab_differs",),
    when=lambda s: s.adapter != "full" and s.adapter_vocab_differs,
    cause=("Adding tokens resizes the embedding and output head before the adapter is created, and the adapter file "
           "then holds whole copies of them (modules_to_save, or PEFT's save_embedding_layers from 0.8.0). "
           "PeftModel.from_pretrained never resizes the base, so loading onto the original vocabulary size stops "
           "in load_state_dict: `size mismatch for ...embed_tokens...: copying a param with shape torch.Size([N, d]) "
           "from checkpoint, the shape in current model is torch.Size([M, d])`. PEFT 0.8.0 - 0.14.x's "
           "AutoPeftModelForCausalLM also resized the base to len(tokenizer) when a tokenizer sat beside the "
           "adapter, shrinking models whose embedding is padded past the tokenizer (Qwen2.5: 151936 rows, 151665 "
           "tokens); 0.15.0 only grows it."),
    fix="Resize the base to the vocabulary the adapter was trained with before loading the adapter onto it.",
    elsewhere="load the base, resize it to the training tokenizer (model.resize_token_embeddings(len(tokenizer)), "
              "with the same pad_to_multiple_of), then PeftModel.from_pretrained; in LLaMA-Factory export with "
              "resize_vocab / the same new_special_tokens; peft >= 0.15.0 for AutoPeftModel on padded embeddings",
    references=("https://github.com/unslothai/unsloth/issues/978",
                "https://github.com/hiyouga/LlamaFactory/issues/3125",
                "https://github.com/hiyouga/LlamaFactory/issues/3154",
                "https://github.com/huggingface/peft/issues/1700", "https://github.com/huggingface/peft/issues/1173",
                "https://github.com/huggingface/peft/issues/1457",
                "https://github.com/huggingface/peft/issues/2415"),
    fixed_in="by design (the base must be resized first); AutoPeftModel's shrink fixed in peft 0.15.0",
    log=LogSigns(
        # The rows differ and the width agrees: a vocabulary of another size (a [0] tensor is an ungathered ZeRO-3
        # save, zero3-empty-adapter-save; another width is another model).
        messages=(Message(r"size mismatch for [\w.]*(?:embed_tokens|lm_head|wte|embed_out|word_embeddings|"
                          r"output_layer|tok_embeddings)(?:\.modules_to_save\.\w+|\.original_module|\.base_layer)?"
                          r"\.weight: copying a param with shape torch\.Size\(\[(\d+), (\d+)\]\) from checkpoint, "
                          r"the shape in current model is torch\.Size\(\[(?!\1,)\d+, \2\]\)", "own",
                          "torch Module.load_state_dict (peft set_peft_model_state_dict)"),),
        evidence=(Evidence("peft", 2, "an adapter is loaded"),),
        prior=1.0,
        tells_apart="the rows of an embedding or head differ between the file and the model while its width "
                    "agrees"),
))
