"""`loraflow check` on the shapes of users' own training scripts seen in public repositories (frontends/script_wild.py):
each test writes a short synthetic script of the shape the named repository showed and checks the reading."""

from __future__ import annotations

from script_check import check, rules


# A TRL trainer given a plain transformers TrainingArguments copies it into its config with to_dict
# (trl/trainer/sft_trainer.py), so TrainingArguments' defaults hold, not TRL's (rsuresh-coder/testcode ft_unsloth.py,
# micchyboy237/jetbot finetune-by-chatgpt.py: SFTTrainer(args=TrainingArguments(output_dir=...))).
PLAIN_ARGS = '''
    from transformers import AutoModelForCausalLM, TrainingArguments
    from peft import LoraConfig
    from trl import SFTTrainer
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")
    args = TrainingArguments(output_dir="out", per_device_train_batch_size=2{extra})
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, peft_config=LoraConfig(r=8))
    trainer.train()
'''


def test_a_trl_trainer_with_plain_training_arguments_keeps_their_defaults(tmp_path, monkeypatch):
    setup = check(tmp_path, monkeypatch, PLAIN_ARGS.format(extra=""))["setup"]
    assert (setup["checkpointing"], setup["precision"]) == ("off", "fp32")


def test_what_the_plain_training_arguments_set_still_counts(tmp_path, monkeypatch):
    setup = check(tmp_path, monkeypatch, PLAIN_ARGS.format(extra=", gradient_checkpointing=True, fp16=True"))["setup"]
    assert (setup["checkpointing"], setup["precision"]) == ("all", "fp16-mixed")


def test_a_trl_config_still_takes_trl_s_defaults(tmp_path, monkeypatch):
    text = PLAIN_ARGS.format(extra="").replace("TrainingArguments", "SFTConfig").replace(
        "from trl import SFTTrainer", "from trl import SFTConfig, SFTTrainer")
    setup = check(tmp_path, monkeypatch, text)["setup"]
    assert (setup["checkpointing"], setup["precision"]) == ("all", "bf16-mixed")


# prepare_model_for_kbit_training after get_peft_model freezes every parameter, the adapter's too (peft
# utils/other.py: `param.requires_grad = False` over model.named_parameters()); namesarnav/llama-finetune
# models/peft_setup.py prepared the model after wrapping it.
KBIT_AFTER = '''
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf",
                                                 quantization_config=BitsAndBytesConfig(load_in_4bit=True))
    {first}
    {second}
    trainer = Trainer(model=model, args=TrainingArguments(output_dir="o", fp16=True), train_dataset=ds)
    trainer.train()
'''
WRAP = 'model = get_peft_model(model, LoraConfig(r=8, task_type="CAUSAL_LM"))'
PREP = "prepare_model_for_kbit_training(model)"


def test_k_bit_preparation_after_the_adapters_freezes_them(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, KBIT_AFTER.format(first=WRAP, second=PREP))
    assert report["setup"]["adapter_loaded_frozen"] is True
    assert "prepare_model_for_kbit_training" in report["sources"]["adapter_loaded_frozen"]
    assert "adapter-loaded-frozen" in rules(report)
    # the fix names the order to change, not is_trainable (which is the fix for an adapter loaded for inference)
    fix = next(f for f in report["findings"] if f["rule"] == "adapter-loaded-frozen")
    assert "before get_peft_model" in fix["fix_here"][0] and "is_trainable" not in fix["fix_here"][0]


def test_k_bit_preparation_before_the_adapters_freezes_only_the_base(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, KBIT_AFTER.format(first="model = " + PREP, second=WRAP))
    assert report["setup"]["adapter_loaded_frozen"] is False
    assert "adapter-loaded-frozen" not in rules(report)


# deepspeed.initialize around a PeftModel of a 4-bit base loaded on the rank's device: the engine's module.to is
# torch's Module.to, which bitsandbytes' parameters follow; transformers refuses only a bare quantized model
# (gammachen/p-llm-dialog-element-extraction train.py: QLoRA under its own deepspeed.initialize).
DS_INIT = '''
    import os, deepspeed
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen-1_8B-Chat",
                                                 quantization_config=BitsAndBytesConfig({bits}=True),
                                                 device_map={{"": int(os.environ.get("LOCAL_RANK", "0"))}})
    model = prepare_model_for_kbit_training(model)
    {wrap}
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config={{"zero_optimization": {{"stage": 2}}}})
    for batch in loader:
        engine.backward(engine(**batch).loss)
        engine.step()
'''


def test_a_deepspeed_engine_around_a_peft_model_of_a_k_bit_base_moves_nothing_refused(tmp_path, monkeypatch):
    for bits in ("load_in_4bit", "load_in_8bit"):
        report = check(tmp_path, monkeypatch, DS_INIT.format(bits=bits, wrap=WRAP))
        assert report["setup"]["quantized_moved"] is False, bits
        assert "kbit-model-moved" not in rules(report)


def test_a_deepspeed_engine_around_a_bare_8_bit_model_is_refused(tmp_path, monkeypatch):
    # transformers#29303 and OpenRLHF#403: the engine's module was the PreTrainedModel itself.
    report = check(tmp_path, monkeypatch, DS_INIT.format(bits="load_in_8bit", wrap="pass"))
    assert report["setup"]["quantized_moved"] is True
    assert "kbit-model-moved" in rules(report)
