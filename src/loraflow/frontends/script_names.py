"""Names in training scripts that script_facts.py tells apart by their spelling alone: the calls that change nothing
check evaluates, and the model classes whose from_pretrained loads a model (the script's own subclasses included)."""

from __future__ import annotations

import re
from typing import Any

# Calls that change nothing check evaluates (tokenizers, data, logging, saving, generation).
HARMLESS = frozenset((
    "AutoTokenizer", "AutoProcessor", "AutoConfig", "AutoImageProcessor", "set_seed", "get_scheduler", "pipeline",
    "DataCollatorForLanguageModeling", "DataCollatorForSeq2Seq", "DataCollatorWithPadding", "default_data_collator",
    "DataCollatorForCompletionOnlyLM", "TextStreamer", "GenerationConfig", "EarlyStoppingCallback", "ScriptArguments",
    "ModelConfig", "print_trainable_parameters", "save_pretrained", "save_model", "push_to_hub", "evaluate",
    "predict", "generate", "eval", "add_callback", "is_bfloat16_supported", "get_chat_template", "logging",
    "train_on_responses_only", "standardize_sharegpt", "apply_chat_template", "parameters", "named_parameters",
    "state_dict", "wait_for_everyone", "unwrap_model", "gather", "main_process_first", "log", "save_state",
    "zero_grad", "no_sync", "accumulate", "autocast", "clip_grad_norm_", "get_nb_trainable_parameters",
    "disable_adapter", "set_adapter", "print", "prepare", "save", "get_peft_config", "get_kbit_device_map",
    "get_quantization_config", "PartialState", "TrainerCallback", "for_inference", "for_training", "is_main_process",
    "named_modules", "modules", "get_input_embeddings", "get_output_embeddings", "tokenizer", "from_dict",
    "get_logger", "get_linear_schedule_with_warmup", "get_cosine_schedule_with_warmup",
    # Unsloth's hardware query, vision collator and exports (merged_16bit dequantizes the 4-bit base layers before
    # merging, as unsloth's tests/qlora/README.md says of its merge), none of which changes what trains.
    "is_bf16_supported", "UnslothVisionDataCollator", "save_pretrained_merged", "push_to_hub_merged",
    "save_pretrained_gguf", "push_to_hub_gguf",
    # Unsloth's vLLM engine (fast_inference=True): save_lora writes the adapter, load_lora reads one back as a LoRA
    # request and fast_generate samples with it (unsloth/models/llama.py, unsloth_zoo/vllm_utils.py); the training
    # rollouts' own use of them is read from fast_inference (script_unsloth.py).
    "save_lora", "load_lora", "fast_generate",
    # PatchFastRL patches TRL's RL trainers as importing unsloth already did (unsloth/models/llama.py calls
    # PatchFastRL(FastLanguageModel = FastLlamaModel) at import; unsloth/models/rl.py).
    "PatchFastRL",
    # PatchDPOTrainer / PatchKTOTrainer add Unsloth's reward statistics to TRL's trainer (unsloth/models/dpo.py).
    "PatchDPOTrainer", "PatchKTOTrainer",
))

# Model classes: AutoModelForCausalLM, LlamaForCausalLM, AutoModel, Qwen2VLForConditionalGeneration, MllamaModel...
_MODEL_CLASS = re.compile(r"^(Auto\w*Model\w*|\w+For[A-Z]\w+|\w+Model)$")


def model_class(name: str, bases: dict[str, str]) -> bool:
    """A model class, or a class the script derives from one (`class Model(Qwen2ForCausalLM)`, Chunk-loss-LoRA's
    example/ds3_qwen_peft.py: `Model.from_pretrained(...)` loads a Qwen2 model)."""
    for _ in range(8):
        if _MODEL_CLASS.match(name):
            return True
        if name not in bases:
            return False
        name = bases[name]
    return False


def passed(made: Any, code: Any) -> bool:
    """Whether a value the script builds (a BitsAndBytesConfig call) reaches another call: as an argument or keyword,
    inside a dict or list passed, or where a call passes `**kwargs` check cannot see into. True for a fragment that
    loads nothing (what it does with the value is not shown)."""
    def holds(value: Any) -> bool:
        if value is made:
            return True
        if isinstance(value, dict):
            return any(holds(v) for v in value.values())
        return isinstance(value, (list, tuple)) and any(holds(v) for v in value)

    others = [c for c in code.calls if c is not made]
    loads = [c for c in others if c.func.endswith("from_pretrained")]
    # Not bound to a plain name (returned by a helper, set on an attribute, inside a conditional expression), or a
    # load whose quantization_config the code computes: where it goes is not visible.
    if not loads or not getattr(made, "target", "") or any(
            c.kwargs.get("quantization_config") is not None and not isinstance(c.kwargs["quantization_config"],
                                                                              (bool, str, dict)) and
            getattr(c.kwargs["quantization_config"], "name", "") != "BitsAndBytesConfig" for c in loads):
        return True
    return any(c.splat or holds(c.args) or holds(c.kwargs) for c in others)


# The GPU's own answer to "bfloat16?" (Unsloth's is_bfloat16_supported, torch.cuda.is_bf16_supported), written as
# `bf16 = is_bfloat16_supported(), fp16 = not is_bfloat16_supported()` in Unsloth's notebooks and the scripts copied
# from them: the run trains in bf16 where the GPU has it and in fp16 where it does not (a T4, a V100).
_BF16_QUERY = re.compile(r"^(not\s+)?\(?\s*(\w+\.)*(is_bfloat16_supported|is_bf16_supported)\(\s*\)\s*\)?$")


def bf16_query(text: str) -> bool | None:
    """The value such a keyword takes on a GPU with bfloat16 (True for the query, False for its `not`), or None
    where the text is not that query."""
    found = _BF16_QUERY.match(text.strip())
    return None if found is None else found.group(1) is None


# Unsloth's own classes that are TRL's underneath (unsloth/trainer.py): `class UnslothTrainer(SFTTrainer)` and
# `class UnslothTrainingArguments(TrainingArguments)` with TrainingArguments bound to trl's SFTConfig where TRL has
# one; they add only embedding_learning_rate (a second optimizer group for modules_to_save embeddings).
LIBRARY_ALIASES = {"UnslothTrainer": "SFTTrainer", "UnslothTrainingArguments": "SFTConfig"}
