"""`loraflow check` on Unsloth training scripts and Colab notebooks exported as scripts (an eleventh sweep): GRPO on
Unsloth's in-process vLLM engine (fast_inference=True), its max_lora_rank against get_peft_model's r, and the
calls of that engine. Each test writes a short synthetic script of the shape the named public repository showed."""

from __future__ import annotations

import json
import textwrap

from loraflow.frontends import parse_versions
from script_check import CURRENT, check, rules


def unknown(report: dict) -> str:
    return "\n".join(report["unknown"])


# The shape of unslothai/notebooks python_scripts/Llama3.1_(8B)-GRPO.py and Qwen3_(4B)-GRPO.py: the model loaded with
# fast_inference=True (Unsloth starts vLLM in the process), GRPOConfig without use_vllm. Unsloth's patched
# GRPOTrainer turns use_vllm on and samples with the adapter as a LoRA request (unsloth/models/rl.py); check read
# the run as sampling with model.generate, so the engine's max_lora_rank was never compared with r.
GRPO = '''
    from unsloth import FastLanguageModel
    from trl import GRPOConfig, GRPOTrainer
    lora_rank = {rank}
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name = "unsloth/Qwen3-4B-Base",
        max_seq_length = 2048,
        load_in_4bit = False,
        fast_inference = True,
        {engine}
        gpu_memory_utilization = 0.9,
    )
    model = FastLanguageModel.get_peft_model(
        model,
        r = lora_rank,
        target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        lora_alpha = lora_rank * 2,
        use_gradient_checkpointing = "unsloth",
        random_state = 3407,
    )
    def reward(completions, **kwargs):
        return [0.0 for _ in completions]
    training_args = GRPOConfig(learning_rate = 5e-6, per_device_train_batch_size = 1, num_generations = 4,
                               max_steps = 100, output_dir = "outputs", report_to = "none")
    trainer = GRPOTrainer(model = model, processing_class = tokenizer, reward_funcs = [reward],
                          args = training_args, train_dataset = dataset)
    trainer.train()
    model.save_lora("grpo_saved_lora")
    out = model.fast_generate(["hi"], lora_request = model.load_lora("grpo_saved_lora"))
'''


def test_unsloth_fast_inference_samples_with_its_vllm_engine_and_the_adapter_as_a_lora_request(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, GRPO.format(rank=32, engine="max_lora_rank = lora_rank,"))
    setup = report["setup"]
    assert setup["rollout_engine"] == "vllm" and setup["rollout_sync"] == "adapter"
    assert setup["generation"] is False
    assert setup["engine_max_lora_rank"] == 32 and setup["adapter_rank"] == 32
    # The trained model shares the engine's weights, and Unsloth sizes the engine's share itself.
    assert "vllm-colocate-memory" not in rules(report) and "vllm-max-lora-rank" not in rules(report)
    # save_lora / load_lora / fast_generate are Unsloth's engine calls, not unread training calls.
    assert "save_lora" not in unknown(report) and "fast_generate" not in unknown(report)


def test_an_adapter_rank_above_unsloths_max_lora_rank_is_refused(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, GRPO.format(rank=64, engine="max_lora_rank = 16,"))
    assert "vllm-max-lora-rank" in rules(report)
    finding = next(f for f in report["findings"] if f["rule"] == "vllm-max-lora-rank")
    assert "max_lora_rank" in json.dumps(finding)


def test_unsloths_own_max_lora_rank_default_is_64(tmp_path, monkeypatch):
    # FastLanguageModel.from_pretrained(max_lora_rank=64) unless given (unsloth/models/loader.py), not vLLM's 16.
    fits = check(tmp_path, monkeypatch, GRPO.format(rank=64, engine=""))
    assert fits["setup"]["engine_max_lora_rank"] == 64 and "vllm-max-lora-rank" not in rules(fits)
    too_big = check(tmp_path, monkeypatch, GRPO.format(rank=128, engine=""))
    assert "vllm-max-lora-rank" in rules(too_big)


def test_a_rank_vllm_does_not_offer_is_refused_when_the_engine_starts(tmp_path, monkeypatch):
    # The notebooks pass max_lora_rank = lora_rank: a rank of 48 starts vLLM with a max_lora_rank outside its list.
    report = check(tmp_path, monkeypatch, GRPO.format(rank=48, engine="max_lora_rank = lora_rank,"))
    assert "vllm-max-lora-rank" in rules(report)


def test_sft_on_a_fast_inference_model_has_no_rollouts(tmp_path, monkeypatch):
    # Qwen3_(4B)-GRPO.py's formatting pre-fine-tune: SFTTrainer on the fast_inference model samples nothing.
    text = GRPO.format(rank=32, engine="max_lora_rank = lora_rank,").replace(
        "GRPOConfig(", "SFTConfig(").replace("GRPOTrainer(", "SFTTrainer(").replace(
        "GRPOConfig, GRPOTrainer", "SFTConfig, SFTTrainer").replace(", num_generations = 4", "").replace(
        "reward_funcs = [reward],", "")
    report = check(tmp_path, monkeypatch, text)
    assert report["setup"]["stage"] == "sft" and report["setup"].get("rollout_engine", "hf") == "hf"


# Unsloth's notebooks (unslothai/notebooks python_scripts/*-Alpaca.py, *-GRPO.py of early 2025) and the scripts copied
# from them write the precision as the GPU's answer: `bf16 = is_bfloat16_supported(), fp16 = not ...`. check listed
# both as values it could not see; PatchFastRL("GRPO", FastLanguageModel) as a call it does not read.
NOTEBOOK_PRECISION = '''
    from unsloth import FastLanguageModel, PatchFastRL, is_bfloat16_supported
    PatchFastRL("GRPO", FastLanguageModel)
    from trl import SFTTrainer
    from transformers import TrainingArguments
    model, tokenizer = FastLanguageModel.from_pretrained("unsloth/llama-3-8b-bnb-4bit", max_seq_length = 2048)
    model = FastLanguageModel.get_peft_model(model, r = 16, lora_alpha = 16, use_gradient_checkpointing = "unsloth")
    trainer = SFTTrainer(
        model = model, tokenizer = tokenizer, train_dataset = dataset, dataset_text_field = "text",
        args = TrainingArguments(per_device_train_batch_size = 2, max_steps = 60, learning_rate = 2e-4,
                                 fp16 = not is_bfloat16_supported(), bf16 = is_bfloat16_supported(),
                                 optim = "adamw_8bit", output_dir = "outputs"),
    )
    trainer.train()
'''


def test_the_gpus_bf16_answer_sets_the_precision(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, NOTEBOOK_PRECISION)
    assert report["setup"]["precision"] == "bf16-mixed"
    assert "is_bfloat16_supported" not in unknown(report) and "PatchFastRL" not in unknown(report)


def test_a_rank_computed_from_the_environment_is_listed_not_refused(tmp_path, monkeypatch):
    # The shape of a Qwen2.5-3B GRPO script driven by environment variables (find_string hit, repo not named):
    # `lora_rank = int(os.environ.get("LORA_RANK", 64))`; check stopped with "is not a LoRA rank".
    text = GRPO.format(rank='int(os.environ.get("LORA_RANK", 64))', engine="max_lora_rank = lora_rank,")
    report = check(tmp_path, monkeypatch, "import os\n" + textwrap.dedent(text))
    assert "get_peft_model(r=lora_rank)" in unknown(report) and "max_lora_rank=lora_rank" in unknown(report)
    assert "vllm-max-lora-rank" not in rules(report)


def test_unsloths_get_peft_model_rank_default_is_named(tmp_path, monkeypatch):
    text = GRPO.format(rank=32, engine="").replace("r = lora_rank,", "")
    report = check(tmp_path, monkeypatch, text)
    assert report["setup"]["adapter_rank"] == 16 and "unsloth" in report["sources"]["adapter_rank"]


# Unsloth's DPO notebook (unslothai/notebooks python_scripts/Zephyr_(7B)-DPO.py) and the scripts that copy it call
# PatchDPOTrainer() before building TRL's DPOTrainer; check took it for a package's own trainer named like TRL's and
# stopped assuming TRL's defaults.
DPO = '''
    from unsloth import FastLanguageModel, PatchDPOTrainer
    PatchDPOTrainer()
    from trl import DPOConfig, DPOTrainer
    model, tokenizer = FastLanguageModel.from_pretrained("unsloth/zephyr-sft-bnb-4bit", max_seq_length = 1024)
    model = FastLanguageModel.get_peft_model(model, r = 64, lora_alpha = 64, use_gradient_checkpointing = "unsloth")
    trainer = DPOTrainer(model = model, ref_model = None, train_dataset = dataset, processing_class = tokenizer,
                         args = DPOConfig(per_device_train_batch_size = 2, bf16 = True, output_dir = "outputs"))
    trainer.train()
'''


def test_patch_dpo_trainer_is_unsloths_patch_not_a_trainer(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, DPO)
    assert report["setup"]["stage"] == "dpo" and "PatchDPOTrainer" not in unknown(report)


# Unsloth's vision notebooks (unslothai/notebooks python_scripts/Llama3.2_(11B)-Vision.py, Qwen2.5_VL_(7B)-Vision.py)
# call FastVisionModel.get_peft_model(finetune_vision_layers = True, ...) without target_modules: Unsloth picks the
# tower's linear layers itself, and requires_grad_for_gradient_checkpointing hooks the tower's input. check saw no
# tower adapters without target_modules, and with target_modules="all-linear" (a vlm-distillation script) reported
# reentrant-partial-silent on transformers < 5, as for a plain enable_input_require_grads.
VISION = '''
    from unsloth import FastVisionModel
    from unsloth.trainer import UnslothVisionDataCollator
    from trl import SFTTrainer, SFTConfig
    model, tokenizer = FastVisionModel.from_pretrained("unsloth/Llama-3.2-11B-Vision-Instruct-bnb-4bit",
                                                       load_in_4bit = True, use_gradient_checkpointing = "unsloth")
    model = FastVisionModel.get_peft_model(model, finetune_vision_layers = {vision}, finetune_language_layers = True,
                                           r = 16, lora_alpha = 16, random_state = 3407{targets})
    FastVisionModel.for_training(model)
    trainer = SFTTrainer(model = model, tokenizer = tokenizer, train_dataset = converted_dataset,
                         data_collator = UnslothVisionDataCollator(model, tokenizer),
                         args = SFTConfig(per_device_train_batch_size = 2, max_steps = 30, bf16 = True,
                                          output_dir = "outputs", remove_unused_columns = False,
                                          dataset_kwargs = {{"skip_prepare_dataset": True}}))
    trainer.train()
'''


def test_unsloth_vision_adapters_reach_the_tower_and_its_input_is_hooked(tmp_path, monkeypatch):
    for targets in ("", ', target_modules = "all-linear"'):
        monkeypatch.setitem(CURRENT, "transformers", parse_versions("transformers=4.49.0")["transformers"])
        report = check(tmp_path, monkeypatch, VISION.format(vision=True, targets=targets))
        assert report["setup"]["tower_adapters"] is True and report["setup"]["tower_input_hook"] is True
        assert "reentrant-partial-silent" not in rules(report)
    report = check(tmp_path, monkeypatch, VISION.format(vision=False, targets=""))
    assert not report["setup"].get("tower_adapters")


# unslothai/notebooks python_scripts/Mistral_v0.3_(7B)-CPT.py: continued pretraining with embed_tokens and lm_head in
# target_modules (Unsloth moves them to modules_to_save) and Unsloth's UnslothTrainer / UnslothTrainingArguments
# (TRL's SFTTrainer / SFTConfig underneath, plus embedding_learning_rate). check read UnslothTrainer as
# transformers' Trainer, listed the arguments as unread and saw no embeddings trained.
CPT = '''
    from unsloth import FastLanguageModel, UnslothTrainer, UnslothTrainingArguments
    model, tokenizer = FastLanguageModel.from_pretrained("unsloth/mistral-7b-v0.3", max_seq_length = 2048)
    model = FastLanguageModel.get_peft_model(model, r = 128, lora_alpha = 32, use_rslora = True,
        target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                          "embed_tokens", "lm_head"], use_gradient_checkpointing = "unsloth")
    trainer = UnslothTrainer(model = model, tokenizer = tokenizer, train_dataset = dataset,
        dataset_text_field = "text", max_seq_length = 2048,
        args = UnslothTrainingArguments(per_device_train_batch_size = 2, max_steps = 120, learning_rate = 5e-5,
                                        embedding_learning_rate = 1e-5, bf16 = True, output_dir = "outputs"))
    trainer.train()
'''


def test_unsloth_trainer_is_trls_sft_trainer_and_full_modules_train(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, CPT)
    setup = report["setup"]
    assert setup["stage"] == "sft" and "transformers' Trainer" not in report["sources"]["stage"]
    assert setup["embeddings_trainable"] is True and setup["lm_head_trainable"] is True
    assert "UnslothTrainingArguments" not in unknown(report) and "UnslothTrainer(" not in unknown(report)


# A CALM runner (find_string hit, repo not named) hands its Unsloth model to `from calm_trainer import Trainer`, the
# project's own class: check read it as transformers' Trainer and assumed that Trainer's defaults.
def test_a_projects_own_trainer_class_is_not_transformers_trainer(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, '''
        from unsloth import FastLanguageModel
        from calm_trainer import Trainer
        model, tokenizer = FastLanguageModel.from_pretrained("Qwen/Qwen2.5-3B-Instruct", load_in_4bit = True)
        model = FastLanguageModel.get_peft_model(model, r = 32, use_gradient_checkpointing = "unsloth")
        Trainer(model = model, calm_args = calm_args).train()
    ''')
    assert "from calm_trainer (its own trainer" in unknown(report)


# Unsloth's notebooks copied with `fp16=True` on an Ampere GPU (unsloth issues "Model is in bfloat16 precision but you
# want to use float16 precision"): the patched trainer refuses the pair since 2025.2.9; dtype=None is the GPU's call.
def test_fp16_training_of_a_bfloat16_unsloth_model_is_refused(tmp_path, monkeypatch):
    import json as _json

    from loraflow.explain import diagnose_log

    text = '''
        import torch
        from unsloth import FastLanguageModel
        from trl import SFTTrainer, SFTConfig
        model, tok = FastLanguageModel.from_pretrained("unsloth/Llama-3.2-1B-Instruct", dtype=DTYPE, load_in_4bit=True)
        model = FastLanguageModel.get_peft_model(model, r=16)
        SFTTrainer(model=model, train_dataset=ds, args=SFTConfig(output_dir="o", fp16=True)).train()
    '''
    sure = check(tmp_path, monkeypatch, text.replace("DTYPE", "torch.bfloat16"))
    assert {f["rule"]: f["holds_if"] for f in sure["findings"]}.get("unsloth-precision-mismatch", "x") is None
    open_ = check(tmp_path, monkeypatch, text.replace("DTYPE", "None"))
    assert "GPU supports bfloat16" in _json.dumps(open_["depends_on"])
    fine = check(tmp_path, monkeypatch, text.replace("DTYPE", "torch.float16"))
    assert "unsloth-precision-mismatch" not in {f["rule"] for f in fine["findings"]}
    log = ("TypeError: Unsloth: Model is in bfloat16 precision but you want to use float16 precision. Set fp16 to "
           "`False` and bf16 to `True`")
    assert diagnose_log(log, None)[1][0].rule.id == "unsloth-precision-mismatch"
