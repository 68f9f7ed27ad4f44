"""`loraflow check` on training scripts (a sixth sweep, for breadth): DeepSpeed configs written as Python dicts with
some values computed, transformers' HfDeepSpeedConfig in scripts that run DeepSpeed without the HF Trainer,
Lightning + PEFT modules, QLoRA notebooks exported as scripts, accelerate loops. Each test writes a short synthetic
script of the shape the named public repository or thread showed."""

from __future__ import annotations

import json

from script_check import check, rules


def unknown(report: dict) -> str:
    return "\n".join(report["unknown"])


# A DeepSpeed config built as a dict in the script, with the micro-batch taken from a variable the code computes
# (the shape of the DeepSpeed-Chat / "non-Trainer integration" scripts: `"train_micro_batch_size_per_gpu":
# per_device_bs`): the whole dict was lost, so the run read as a single-process run without DeepSpeed.
DS_DICT = '''
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments, Trainer
    from peft import LoraConfig, get_peft_model
    micro_bs = 8 // 2
    ds_config = {{
        "train_micro_batch_size_per_gpu": micro_bs,
        "gradient_accumulation_steps": 1,
        "bf16": {{"enabled": True}},
        "zero_optimization": {{"stage": {stage}, "overlap_comm": True}},
    }}
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", torch_dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    args = TrainingArguments(output_dir="out", deepspeed=ds_config)
    Trainer(model=model, args=args).train()
'''


def test_a_computed_value_keeps_the_literal_keys_of_a_deepspeed_dict(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, DS_DICT.format(stage=3))
    setup = report["setup"]
    assert setup["engine"] == "deepspeed" and setup["zero_stage"] == 3 and setup["precision"] == "bf16-mixed"
    assert "train_micro_batch_size_per_gpu = 8 // 2" in unknown(report)
    assert "overlap_comm" not in unknown(report)


def test_a_computed_zero_stage_is_evaluated_for_every_stage(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, DS_DICT.format(stage="int(os.environ['STAGE'])"))
    assert report["setup"]["engine"] == "deepspeed"
    assert "zero_optimization.stage" in json.dumps(report) and "computed" in json.dumps(report)


# argparse flags inside the dict (`"stage": args.zero_stage`, DeepSpeed-Chat's get_train_ds_config shape written
# inline): the launch line's value, else the parser's default, is the value.
DS_FLAGS = '''
    import argparse
    from transformers import AutoModelForCausalLM, TrainingArguments, Trainer
    from peft import LoraConfig, get_peft_model
    parser = argparse.ArgumentParser()
    parser.add_argument("--zero_stage", type=int, default=2)
    parser.add_argument("--bs", type=int, default=4)
    args = parser.parse_args()
    ds_config = {"train_micro_batch_size_per_gpu": args.bs, "zero_optimization": {"stage": args.zero_stage}}
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    Trainer(model=model, args=TrainingArguments(output_dir="out", deepspeed=ds_config)).train()
'''


def test_parsed_flags_in_a_deepspeed_dict_come_from_the_launch_line_or_the_default(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, DS_FLAGS)
    assert report["setup"]["zero_stage"] == 2 and not unknown(report)
    report = check(tmp_path, monkeypatch, DS_FLAGS, ["deepspeed", "--num_gpus", "2", "train.py", "--zero_stage", "3"])
    assert report["setup"]["zero_stage"] == 3


def test_a_key_set_later_in_a_nested_section_is_read(tmp_path, monkeypatch):
    text = DS_DICT.format(stage=2).replace("    model = Auto", '    ds_config["zero_optimization"]["stage"] = 3\n'
                                           "    model = Auto", 1)
    assert check(tmp_path, monkeypatch, text)["setup"]["zero_stage"] == 3


# transformers' "non-Trainer DeepSpeed integration" (its docs, and scripts such as DeepSpeedExamples' inference /
# training loops): `dschf = HfDeepSpeedConfig(ds_config)` before from_pretrained builds the model under zero.Init;
# without it a deepspeed.initialize loop partitions a model built whole in its load dtype.
OWN_DS = '''
    import deepspeed
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig
    from peft import LoraConfig, get_peft_model
    ds_config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
    MARKER
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    engine.train()
    for batch in loader:
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
'''


def test_hf_deepspeed_config_means_zero_init_at_the_load(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, OWN_DS.replace("MARKER", "dschf = HfDeepSpeedConfig(ds_config)"),
                   deepspeed="0.19.2")
    assert report["setup"]["mixed_param_dtypes"] is True and "zero3-mixed-dtype-gather" in rules(report)
    assert "HfDeepSpeedConfig" not in unknown(report)


def test_a_deepspeed_loop_without_it_builds_the_model_whole(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, OWN_DS.replace("MARKER", "pass"), deepspeed="0.19.2")
    assert report["setup"]["mixed_param_dtypes"] is False and "zero3-mixed-dtype-gather" not in rules(report)


def test_an_hf_deepspeed_config_not_kept_does_nothing(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, OWN_DS.replace("MARKER", "HfDeepSpeedConfig(ds_config)"),
                   deepspeed="0.19.2")
    assert report["setup"]["mixed_param_dtypes"] is False
    assert any("weakref" in n for n in report["notes"])


def test_hf_deepspeed_config_alone_names_the_run_s_deepspeed_config(tmp_path, monkeypatch):
    # accelerate's custom loop with the config only in HfDeepSpeedConfig (the plugin built from the same dict).
    text = OWN_DS.replace("MARKER", "dschf = HfDeepSpeedConfig(ds_config)").replace(
        "config=ds_config)", "config=make_config())")
    setup = check(tmp_path, monkeypatch, text)["setup"]
    assert setup["engine"] == "deepspeed" and setup["zero_stage"] == 3


# A model class of the script's own (`class Model(Qwen2ForCausalLM)`, malaysia-ai/Chunk-loss-LoRA's
# example/ds3_qwen_peft.py): its from_pretrained is a load (eval mode, a dtype), not a harmless call.
SUBCLASS = '''
    import torch, deepspeed
    from transformers import Qwen2ForCausalLM
    from peft import LoraConfig, get_peft_model
    class Model(Qwen2ForCausalLM):
        pass
    model = Model.from_pretrained("Qwen/Qwen2.5-0.5B-Instruct", torch_dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config_params={"zero_optimization": {"stage": 3}})
    loss = model(input_ids=ids, labels=ids)["loss"]
    engine.backward(loss)
    engine.step()
    SAVE
'''


def test_a_subclass_of_a_model_class_loads_a_model(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, SUBCLASS.replace("SAVE", ""))
    assert report["setup"]["train_mode_at_backward"] is False
    assert "Model.from_pretrained" in report["sources"]["train_mode_at_backward"]


def test_an_own_deepspeed_loop_saving_with_save_pretrained_gathers_nothing(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, SUBCLASS.replace("SAVE", 'model.save_pretrained("out")'))
    assert report["setup"]["adapter_save_gather"] is False and "zero3-empty-adapter-save" in rules(report)
    gathered = SUBCLASS.replace("SAVE", 'model.save_pretrained("out", state_dict=accelerator.get_state_dict(engine))')
    assert check(tmp_path, monkeypatch, gathered)["setup"]["adapter_save_gather"] is True
    assert check(tmp_path, monkeypatch, SUBCLASS.replace("SAVE", ""))["setup"]["adapter_save_gather"] is True


# TrainingArguments(deepspeed=<a path the code computes>) (p513817/deepspeed-tutorial training/llama3-70b/
# llama3-ds.py: `deepspeed=common.get_env("DS_CONFIG")`): a DeepSpeed run, read as DDP without DeepSpeed before.
COMPUTED_DS = '''
    import os
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(AutoModelForCausalLM.from_pretrained("m"), LoraConfig(target_modules=["q_proj"]))
    args = TrainingArguments(output_dir="o", fp16=True, deepspeed=PATH)
    Trainer(model=model, args=args).train()
'''


def test_a_computed_deepspeed_path_is_a_deepspeed_run(tmp_path, monkeypatch):
    argv = ["deepspeed", "--num_gpus", "2", "train.py"]
    report = check(tmp_path, monkeypatch, COMPUTED_DS.replace("PATH", 'os.environ["DS_CONFIG"]'), argv)
    assert report["setup"]["engine"] == "deepspeed"
    named = COMPUTED_DS.replace("PATH", 'os.path.join(cfg_dir, "ds_z3_offload.json")')
    assert check(tmp_path, monkeypatch, named, argv)["setup"]["zero_stage"] == 3


# The script's own argparse flags passed into TrainingArguments (tohtana/ds_repro_2746 run_seq2seq_deepspeed_peft.py:
# `gradient_checkpointing=args.gradient_checkpointing` with `default=True`, `bf16=args.bf16` with a computed default,
# its parser reached through `args, _ = parse_arge()`, a function of its own returning parse_known_args()).
OWN_FLAGS = '''
    import argparse, torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from peft import LoraConfig, get_peft_model
    def parse_arge():
        parser = argparse.ArgumentParser()
        parser.add_argument("--gc", type=bool, default=True)
        parser.add_argument("--bf16", type=bool, default=torch.cuda.get_device_capability()[0] == 8)
        parser.add_argument("--use_fp16", action="store_true")
        return parser.parse_known_args()
    def main():
        args, _ = parse_arge()
        model = get_peft_model(AutoModelForCausalLM.from_pretrained("m"), LoraConfig(target_modules=["q_proj"]))
        targs = TrainingArguments(output_dir="o", gradient_checkpointing=args.gc, bf16=args.bf16, fp16=args.use_fp16)
        Trainer(model=model, args=targs).train()
    main()
'''


def test_a_keyword_from_the_script_s_own_flag_takes_the_parser_s_default(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, OWN_FLAGS, ["python", "train.py"])
    assert report["setup"]["checkpointing"] == "all" and "defaults it to True" in report["sources"]["checkpointing"]
    assert "computes its default" in unknown(report)


def test_a_keyword_from_the_script_s_own_flag_takes_the_launch_line_s_value(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, OWN_FLAGS, ["python", "train.py", "--use_fp16"])
    assert report["setup"]["precision"] == "fp16-mixed" and "--use_fp16" not in unknown(report)


# An accelerate loop under a ZeRO-3 accelerate config that saves nothing itself (huggingface/peft#119's
# run_clm_no_hf_trainer.py shape): the HF Trainer's save through the config's 16-bit gather is not this script's.
ACCELERATE_LOOP = '''
    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    accelerator = Accelerator()
    model = get_peft_model(AutoModelForCausalLM.from_pretrained("m"), LoraConfig(target_modules=["q_proj"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    for batch in loader:
        accelerator.backward(model(**batch).loss)
        optimizer.step()
'''
ZERO3_ACCELERATE = "distributed_type: DEEPSPEED\nmixed_precision: fp16\nnum_processes: 4\n" \
                   "deepspeed_config:\n  zero_stage: 3\n  zero3_init_flag: true\n"


def test_an_accelerate_loop_that_saves_nothing_has_no_empty_save(tmp_path, monkeypatch):
    (tmp_path / "acc.yaml").write_text(ZERO3_ACCELERATE)
    argv = ["accelerate", "launch", "--config_file", "acc.yaml", "train.py"]
    report = check(tmp_path, monkeypatch, ACCELERATE_LOOP, argv, transformers="4.26.1")
    assert report["setup"]["zero_stage"] == 3 and "zero3-empty-adapter-save" not in rules(report)


# Lightning's own quantization plugin on a PEFT model (Lightning-AI/pytorch-lightning#18936's
# Trainer(plugins=BitsandbytesPrecision(...)) shape): it replaces every nn.Linear, PEFT's lora_A / lora_B too.
LIGHTNING_BNB = '''
    import lightning as L
    import torch
    from lightning.pytorch.plugins import BitsandbytesPrecision
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            base = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf")
            self.model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss
    trainer = L.Trainer(devices=1, plugins=BitsandbytesPrecision(mode="MODE", dtype=torch.bfloat16))
    trainer.fit(Model(), datamodule=dm)
'''


def test_lightning_s_bitsandbytes_plugin_quantizes_the_lora_layers_too(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, LIGHTNING_BNB.replace("MODE", "nf4-dq"))
    assert report["setup"]["quantization"] == "4bit" and "adapter-loaded-frozen" in rules(report)
    report = check(tmp_path, monkeypatch, LIGHTNING_BNB.replace("MODE", "int8-training"))
    assert report["setup"]["quantization"] is None and "adapter-loaded-frozen" not in rules(report)


def test_a_module_launch_of_a_script_here_is_that_script(tmp_path, monkeypatch):
    # `torchrun -m hf_trainer` (malaysia-ai/Chunk-loss-LoRA example/hf_trainer.py's launch line): the module is the
    # file beside the launch; a dotted module (a package's) is not.
    from loraflow.frontends.script_setup import script_of
    check(tmp_path, monkeypatch, SUBCLASS.replace("SAVE", ""))
    (tmp_path / "hf_trainer.py").write_text((tmp_path / "train.py").read_text())
    assert script_of("hf_trainer") is not None and script_of("pkg.hf_trainer") is None


# run_clm's argument parsing (malaysia-ai/Chunk-loss-LoRA example/hf_trainer.py): `parse_json_file(...)` if one JSON
# is given, else `parse_args_into_dataclasses()`; either way the names hold the parsed arguments (read as unknown
# before, so an `if args.use_lora:` over them was not decided by the flag's default).
EITHER_PARSER = '''
    import sys
    from dataclasses import dataclass, field
    from transformers import AutoModelForCausalLM, HfArgumentParser, Trainer, TrainingArguments
    from peft import LoraConfig, get_peft_model
    @dataclass
    class ScriptArguments:
        use_lora: bool = field(default=False)
    parser = HfArgumentParser((ScriptArguments, TrainingArguments))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        script_args, training_args = parser.parse_json_file(json_file=sys.argv[1])
    else:
        script_args, training_args = parser.parse_args_into_dataclasses()
    model = AutoModelForCausalLM.from_pretrained("m")
    if script_args.use_lora:
        model = get_peft_model(model, LoraConfig(target_modules=["q_proj"]))
    Trainer(model=model, args=training_args).train()
'''


def test_either_parser_gives_the_parsed_arguments(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, EITHER_PARSER, ["python", "train.py", "--output_dir", "o"])
    assert report["setup"]["adapter"] == "full" and "Trainer(args=training_args)" not in unknown(report)
    report = check(tmp_path, monkeypatch, EITHER_PARSER, ["python", "train.py", "--use_lora", "true"])
    assert report["setup"]["adapter"] == "lora"


# A DeepSpeed config built by a helper of the script's own (DeepSpeed-Chat's get_train_ds_config, the shape of
# OpenRLHF/OpenRLHF#100's strategy): the returned dict is read, its parameters bound to what the call passes.
HELPER_DS = '''
    import argparse, deepspeed, torch
    from transformers import AutoModelForCausalLM
    from peft import LoraConfig, get_peft_model
    def get_train_ds_config(offload, stage=2, bf16=True):
        return {"zero_optimization": {"stage": stage, "offload_param": {"device": "cpu" if offload else "none"}},
                "bf16": {"enabled": bf16}, "train_micro_batch_size_per_gpu": 1}
    parser = argparse.ArgumentParser()
    parser.add_argument("--zero_stage", type=int, default=2)
    args = parser.parse_args()
    ds_config = get_train_ds_config(offload=False, stage=args.zero_stage)
    model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj"]))
    engine, *_ = deepspeed.initialize(model=model, config=ds_config)
    engine.train()
    for batch in loader:
        engine.backward(engine(**batch).loss)
        engine.step()
'''


def test_a_helper_s_deepspeed_dict_is_read_with_the_call_s_arguments(tmp_path, monkeypatch):
    argv = ["deepspeed", "--num_gpus", "8", "train.py", "--zero_stage", "3"]
    report = check(tmp_path, monkeypatch, HELPER_DS, argv, deepspeed="0.10.2")
    setup = report["setup"]
    assert setup["engine"] == "deepspeed" and setup["zero_stage"] == 3 and setup["precision"] == "bf16-mixed"
    assert "--zero_stage" not in unknown(report)
    # no HfDeepSpeedConfig: the engine casts the whole module to bf16 before partitioning it
    assert setup["mixed_param_dtypes"] is False and "zero3-mixed-dtype-gather" not in rules(report)


# The parsed arguments handed to the script's entry point (`main(parse_args())`), and a keyword computed by comparing
# known values (`bf16=torch_dtype == torch.bfloat16`): LazarusNLP/SemEval2025-Emotion-Analysis
# src/run_sft_instruct_qlora.py; both were read as not visible.
MAIN_ARGS = '''
    from argparse import ArgumentParser
    import torch
    from peft import LoraConfig
    from trl import SFTTrainer
    from transformers import AutoModelForCausalLM, TrainingArguments
    def parse_args():
        parser = ArgumentParser()
        parser.add_argument("--gradient_checkpointing", action="store_true")
        parser.add_argument("--batch_size", type=int, default=16)
        return parser.parse_args()
    def main(args):
        torch_dtype = torch.bfloat16
        model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch_dtype)
        args = TrainingArguments(output_dir="o", gradient_checkpointing=args.gradient_checkpointing,
                                 per_device_train_batch_size=args.batch_size,
                                 fp16=torch_dtype == torch.float16, bf16=torch_dtype == torch.bfloat16)
        SFTTrainer(model=model, args=args, peft_config=LoraConfig(target_modules=["q_proj"])).train()
    if __name__ == "__main__":
        main(parse_args())
'''


def test_the_entry_point_s_parsed_arguments_and_a_known_comparison(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, MAIN_ARGS, ["python", "train.py", "--gradient_checkpointing"])
    setup = report["setup"]
    assert setup["checkpointing"] == "all" and setup["precision"] == "bf16-mixed"
    assert "not a literal" not in unknown(report) and "--batch_size" not in unknown(report)
    assert check(tmp_path, monkeypatch, MAIN_ARGS, ["python", "train.py"])["setup"]["checkpointing"] == "off"


# A script that parses no flags (huggingface/trl#1303's guanaco QLoRA SFTTrainer script, launched on 2 GPUs):
# its fixes are in its code's words, not TrainingArguments command-line flags it never reads.
NO_PARSER = '''
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, TrainingArguments
    from peft import LoraConfig
    from trl import SFTTrainer
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float16)
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", quantization_config=bnb)
    args = TrainingArguments(output_dir="o", fp16=True, gradient_checkpointing=True)
    SFTTrainer(model=model, peft_config=LoraConfig(r=64), args=args).train()
'''


def test_a_script_without_a_parser_is_fixed_in_its_code(tmp_path, monkeypatch):
    report = check(tmp_path, monkeypatch, NO_PARSER, ["torchrun", "--nproc_per_node", "2", "train.py"],
                   trl="0.7.10", transformers="4.37.2", peft="0.8.2")
    assert "ddp-reentrant-unused" in rules(report)
    fixes = json.dumps(report["findings"])
    assert "--ddp_find_unused_parameters" not in fixes and "ddp_find_unused_parameters= (TrainingArguments)" in fixes


# A wrap policy of one's own set on accelerate's FSDP plugin after the HF Trainer is built
# (huggingface/transformers#27573: `trainer.accelerator.state.fsdp_plugin.auto_wrap_policy = our_custom_wrap_policy`).
POLICY_OVERRIDE = '''
    import functools
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from peft import LoraConfig, get_peft_model
    model = get_peft_model(AutoModelForCausalLM.from_pretrained("m"), LoraConfig(target_modules=["q_proj"]))
    args = TrainingArguments(output_dir="o", fsdp="full_shard auto_wrap", fsdp_config={"use_orig_params": False})
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LlamaDecoderLayer})
    trainer = Trainer(model=model, args=args)
    trainer.accelerator.state.fsdp_plugin.auto_wrap_policy = policy
    trainer.train()
'''


def test_a_wrap_policy_set_on_the_trainer_s_fsdp_plugin_decides_the_units(tmp_path, monkeypatch):
    # transformers 5.9: the last release whose `fsdp=` builds FSDP1 by default (FSDP2 from 5.10).
    report = check(tmp_path, monkeypatch, POLICY_OVERRIDE, ["torchrun", "--nproc_per_node", "2", "train.py"],
                   transformers="5.9.0")
    assert report["setup"]["fsdp_frozen_units_separate"] is False and "fsdp1-mixed-requires-grad" in rules(report)


# advx-25-cdss/model (train/model.py, train/trainer.py): PiSSA initialization in the script's own LoraConfig, and
# the training keywords built by `def extract_kwargs(**kwargs): return kwargs`.
PISSA = '''
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-1.7B", torch_dtype=torch.bfloat16)
    peft_config = LoraConfig(init_lora_weights="pissa_niter_32", r=8, target_modules="all-linear")
    def extract_kwargs(**kwargs):
        return kwargs
    args = extract_kwargs(output_dir="o", bf16=True, deepspeed="ds_z3.json")
    SFTTrainer(model=model, peft_config=peft_config, args=SFTConfig(**args)).train()
'''


def test_a_weight_reading_init_and_a_kwargs_helper_are_read(tmp_path, monkeypatch):
    (tmp_path / "ds_z3.json").write_text('{"zero_optimization": {"stage": 3}, "bf16": {"enabled": "auto"}}')
    report = check(tmp_path, monkeypatch, PISSA, ["deepspeed", "--num_gpus", "2", "train.py"], peft="0.11.1")
    setup = report["setup"]
    assert setup["adapter_reads_base"] == "svd" and setup["zero_stage"] == 3 and setup["precision"] == "bf16-mixed"
    assert "zero3-init-adapter-read" in rules(report) and "**args" not in unknown(report)


# Chunk-loss-LoRA's `torchrun -m hf_trainer`: a module launched by name from the working directory is the script
# beside it, read as code (before, its flags alone: a full fine-tune).
def test_a_module_launched_by_name_is_the_script_here(tmp_path, monkeypatch):
    text = '''
        from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(AutoModelForCausalLM.from_pretrained("x"), LoraConfig(r=8))
        Trainer(model=model, args=TrainingArguments(output_dir="o")).train()
    '''
    report = check(tmp_path, monkeypatch, text, ["torchrun", "--nproc_per_node", "2", "-m", "train"])
    assert report["setup"]["adapter"] == "lora"


# SmolVLM2's fine-tuning notebook (huggingface/smollm vision/finetuning) and many Colab exports: module switches
# `USE_LORA = False` / `USE_QLORA = False` pick a branch; only the branch that runs is read.
def test_module_switches_decide_which_branch_is_read(tmp_path, monkeypatch):
    text = '''
        import torch
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments
        from peft import LoraConfig, get_peft_model
        USE_LORA = False
        USE_QLORA = False
        if USE_QLORA or USE_LORA:
            bnb = BitsAndBytesConfig(load_in_4bit=True) if USE_QLORA else None
            model = AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb, torch_dtype=torch.bfloat16)
            model = get_peft_model(model, LoraConfig(r=8))
        else:
            model = AutoModelForCausalLM.from_pretrained("m", torch_dtype=torch.bfloat16)
        Trainer(model=model, args=TrainingArguments(output_dir="o", bf16=True)).train()
    '''
    report = check(tmp_path, monkeypatch, text)
    assert report["setup"]["adapter"] == "full" and report["setup"]["quantization"] is None
    assert "bf16-lost-updates" in rules(report)
    lora = check(tmp_path, monkeypatch, text.replace("USE_LORA = False", "USE_LORA = True"))
    assert lora["setup"]["adapter"] == "lora" and lora["setup"]["quantization"] is None


# PaliGemma fine-tuning scripts (merveenoyan/smol-vision's paligemma script and its copies): a BitsAndBytesConfig is
# built for the QLoRA variant but the load does not take it; and `paligemma-3b` is a Gemma 1, not a Gemma 3.
def test_an_unused_bnb_config_quantizes_nothing_and_paligemma_is_no_gemma3(tmp_path, monkeypatch):
    text = '''
        import torch
        from transformers import PaliGemmaForConditionalGeneration, BitsAndBytesConfig, Trainer, TrainingArguments
        from peft import LoraConfig, get_peft_model
        bnb_config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
        model = PaliGemmaForConditionalGeneration.from_pretrained("google/paligemma-3b-pt-224", device_map={"": 0})
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        Trainer(model=model, args=TrainingArguments(output_dir="o", fp16=True)).train()
    '''
    report = check(tmp_path, monkeypatch, text)
    assert report["setup"]["quantization"] is None and not report["setup"]["fp16_overflows"]
    used = check(tmp_path, monkeypatch, text.replace('device_map={"": 0})', 'quantization_config=bnb_config)'))
    assert used["setup"]["quantization"] == "4bit"


# Idefics2/Florence-2/PaliGemma fine-tuning scripts with transformers' Trainer and a collator that calls the processor
# without truncation: nothing cuts a sample, so the image-token question is not asked; a length limit brings it back.
def test_no_truncation_anywhere_settles_the_image_token_question(tmp_path, monkeypatch):
    text = '''
        from transformers import AutoProcessor, Idefics2ForConditionalGeneration, Trainer, TrainingArguments
        from peft import LoraConfig, get_peft_model
        processor = AutoProcessor.from_pretrained("HuggingFaceM4/idefics2-8b")
        def collate(examples):
            return processor(text=[e["text"] for e in examples], images=[e["images"] for e in examples],
                             return_tensors="pt", padding=True)
        model = Idefics2ForConditionalGeneration.from_pretrained("HuggingFaceM4/idefics2-8b")
        model = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        Trainer(model=model, args=TrainingArguments(output_dir="o"), data_collator=collate).train()
    '''
    report = check(tmp_path, monkeypatch, text)
    assert report["setup"]["image_safe_truncation"] is True
    cut = check(tmp_path, monkeypatch, text.replace("padding=True)", "padding=True, truncation=True, max_length=512)"))
    assert "cut inside its image tokens" in json.dumps(cut["depends_on"])


# Florence-2's distributed_train.py and the DDP tutorials: `mp.spawn(train, nprocs=world_size)` under `python
# train.py` starts the processes itself: a literal count is the world size, an expression leaves it open.
def test_processes_the_script_spawns_itself(tmp_path, monkeypatch):
    text = '''
        import torch
        import torch.multiprocessing as mp
        from torch.nn.parallel import DistributedDataParallel as DDP
        from transformers import AutoModelForCausalLM
        from peft import LoraConfig, get_peft_model
        def train(rank, world_size):
            model = DDP(get_peft_model(AutoModelForCausalLM.from_pretrained("m"), LoraConfig(r=8)).to(rank))
            model(**batch).loss.backward()
        if __name__ == "__main__":
            mp.spawn(train, args=(4,), nprocs=4)
    '''
    report = check(tmp_path, monkeypatch, text, ["python", "train.py"])
    assert report["setup"]["world_size"] == 4
    some = check(tmp_path, monkeypatch, text.replace("nprocs=4", "nprocs=torch.cuda.device_count()"),
                 ["python", "train.py"])
    assert some["scenarios"] >= 2  # one process and several, each evaluated


# A script's argparse flag declared `type=bool` (a common slip: tohtana/ds_repro_2746, many fine-tuning repos):
# bool("False") is True, so `--use_lora False --fp16 False` turns both on.
def test_a_type_bool_flag_is_on_for_any_text(tmp_path, monkeypatch):
    text = '''
        import argparse
        from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
        from peft import LoraConfig, get_peft_model
        parser = argparse.ArgumentParser()
        parser.add_argument("--use_lora", type=bool, default=True)
        parser.add_argument("--fp16", type=bool, default=False)
        args = parser.parse_args()
        model = AutoModelForCausalLM.from_pretrained("m")
        if args.use_lora:
            model = get_peft_model(model, LoraConfig(r=8))
        Trainer(model=model, args=TrainingArguments(output_dir="o", fp16=args.fp16)).train()
    '''
    report = check(tmp_path, monkeypatch, text, ["python", "train.py", "--use_lora", "False", "--fp16", "False"])
    assert report["setup"]["adapter"] == "lora" and report["setup"]["precision"] == "fp16-mixed"
    assert "bool('False') is True" in report["sources"]["precision"]
    plain = check(tmp_path, monkeypatch, text.replace("type=bool, ", 'action="store_true", ').replace(
        "default=True", "default=False"), ["python", "train.py"])
    assert plain["setup"]["adapter"] == "full" and plain["setup"]["precision"] == "fp32"


# HenshawMike's gemma3 script, advx-25-cdss/model's GRPO stage, trl PR #2725's thread: get_peft_model, then the TRL
# trainer given the PeftModel and peft_config too. TRL >= 0.27 refuses the pair (PR #4713); a merge in between is fine.
def test_a_peft_model_with_a_peft_config_is_refused_by_trl_0_27(tmp_path, monkeypatch):
    text = '''
        from transformers import AutoModelForCausalLM
        from peft import LoraConfig, get_peft_model
        from trl import SFTTrainer, SFTConfig
        peft_config = LoraConfig(r=16, target_modules="all-linear")
        model = get_peft_model(AutoModelForCausalLM.from_pretrained("m"), peft_config)
        SFTTrainer(model=model, args=SFTConfig(output_dir="o"), train_dataset=ds, peft_config=peft_config).train()
    '''
    assert "peft-config-on-peft-model" in rules(check(tmp_path, monkeypatch, text))
    assert "peft-config-on-peft-model" not in rules(check(tmp_path, monkeypatch, text, trl="0.26.0"))
    merged = text.replace("peft_config)\n", "peft_config).merge_and_unload()\n", 1)
    assert "peft-config-on-peft-model" not in rules(check(tmp_path, monkeypatch, merged))


# Found in review: a switch the code reassigns decides nothing; a BitsAndBytesConfig returned by a helper is passed;
# a dataset or collator of the project's own modules may truncate.
def test_review_switches_helpers_and_project_modules(tmp_path, monkeypatch):
    reassigned = '''
        import argparse
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments
        from peft import LoraConfig, get_peft_model
        USE_QLORA = False
        def build():
            bnb = BitsAndBytesConfig(load_in_4bit=True) if USE_QLORA else None
            return get_peft_model(AutoModelForCausalLM.from_pretrained("m", quantization_config=bnb), LoraConfig())
        if __name__ == "__main__":
            p = argparse.ArgumentParser()
            p.add_argument("--low_mem", action="store_true")
            USE_QLORA = p.parse_args().low_mem
            Trainer(model=build(), args=TrainingArguments(output_dir="o")).train()
    '''
    assert check(tmp_path, monkeypatch, reassigned)["setup"]["quantization"] == "4bit"
    helper = '''
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments
        def quant_config():
            return BitsAndBytesConfig(load_in_4bit=True)
        model = AutoModelForCausalLM.from_pretrained("m", quantization_config=quant_config())
        Trainer(model=model, args=TrainingArguments(output_dir="o")).train()
    '''
    assert check(tmp_path, monkeypatch, helper)["setup"]["quantization"] == "4bit"
    project = '''
        from transformers import AutoProcessor, Qwen2VLForConditionalGeneration, Trainer, TrainingArguments
        from my_data import build_dataset, collate
        processor = AutoProcessor.from_pretrained("Qwen/Qwen2-VL-2B-Instruct")
        model = Qwen2VLForConditionalGeneration.from_pretrained("Qwen/Qwen2-VL-2B-Instruct")
        Trainer(model=model, args=TrainingArguments(output_dir="o"), train_dataset=build_dataset("d.json", processor),
                data_collator=lambda b: collate(b, processor)).train()
    '''
    assert "cut inside its image tokens" in json.dumps(check(tmp_path, monkeypatch, project)["depends_on"])
