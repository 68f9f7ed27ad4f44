"""Sweep wild13 (torchtune 0.5-0.6 configs, LitGPT config_hub and launches, Lightning scripts): classes of input that
`loraflow check` misread, each with a short synthetic input of the shape a public source showed."""

from __future__ import annotations

import json
import shlex

from packaging.version import Version

from loraflow.frontends import from_command, from_files, parse_versions, run_check

CURRENT = {"torch": Version("2.13.0"), "transformers": Version("5.23.0"), "peft": Version("0.21.2")}
CURRENT_ALL = parse_versions("torch=2.13.0,transformers=5.23.0,peft=0.21.2,deepspeed=0.19.8,accelerate=1.15.0,"
                             "bitsandbytes=0.50.2")

_TT_BODY = """model:
  _component_: torchtune.models.llama3_3.llama3_3_70b
checkpointer:
  _component_: torchtune.training.FullModelHFCheckpointer
enable_activation_checkpointing: True
custom_sharded_layers: ['tok_embeddings', 'output']
fsdp_cpu_offload: False
dtype: bf16
"""


def test_torchtune_config_without_launch_line_reads_the_recipe_its_header_names(tmp_path):
    # pytorch/torchtune recipes/configs/llama3_3/70B_full_multinode.yaml: launched from a SLURM script, so its header
    # names the recipe (`# Config for ... in full_finetune_distributed.py`) but carries no `tune run` line.
    path = tmp_path / "70B_full_multinode.yaml"
    path.write_text("# Config for multi-node full finetuning in full_finetune_distributed.py\n"
                    "#   sbatch full_finetune_multinode.slurm\n" + _TT_BODY)
    r = from_files("torchtune", [str(path)], CURRENT)
    assert (r.setup.engine, r.setup.adapter) == ("fsdp2", "full")
    assert "world_size" in r.unsure  # how many processes is in the SLURM script, not here


def test_torchtune_config_with_distributed_only_keys_is_a_distributed_recipe(tmp_path):
    # A user's copy of a torchtune config whose header is gone: custom_sharded_layers / fsdp_cpu_offload are read
    # only by recipes/*_distributed.py, so it is not a single-device run.
    path = tmp_path / "my_70b.yaml"
    path.write_text(_TT_BODY.replace("llama3_3_70b", "lora_llama3_3_70b"))
    r = from_files("torchtune", [str(path)], CURRENT)
    assert (r.setup.engine, r.setup.adapter) == ("fsdp2", "lora")
    assert any("lora_finetune_distributed" in n for n in r.notes)


def test_torchtune_optimizer_in_bwd_dates_only_the_distributed_recipes(tmp_path):
    # pytorch/torchtune recipes/full_finetune_single_device.py reads cfg.optimizer_in_bwd from v0.1 (its
    # llama2/7B_full_low_memory config); only the distributed recipes gained it later.
    path = tmp_path / "full_low_memory.yaml"
    path.write_text("model:\n  _component_: torchtune.models.llama2.llama2_7b\ncheckpointer:\n  _component_: x\n"
                    "optimizer_in_bwd: True\ndtype: bf16\n")
    single = from_command(shlex.split(f"tune run full_finetune_single_device --config {path}"), CURRENT)
    assert "torchtune" not in single.eras
    multi = from_command(shlex.split(f"tune run --nproc_per_node 2 full_finetune_distributed --config {path}"),
                         CURRENT)
    assert multi.eras["torchtune"][0].startswith(">=0.4")


def test_litgpt_null_quantize_is_no_quantization():
    # jsonargparse reads `null` as None: Lightning-AI/litgpt config_hub/finetune/*/qlora.yaml with `--quantize null`
    # (or a YAML `quantize: null`) trains unquantized, so several devices do not hit the quantization refusal.
    r = from_command(shlex.split("litgpt finetune_lora checkpoints/meta-llama/Meta-Llama-3.1-8B --quantize null "
                                 "--precision bf16-true --devices 2"), CURRENT)
    assert r.setup.quantization is None and r.unknown == []
    assert not any("NotImplementedError" in n for n in r.notes)


_FABRIC = '''
import torch
import lightning as L
from lightning.fabric.plugins import BitsandbytesPrecision
from transformers import AutoModelForCausalLM, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model

fabric = L.Fabric(devices=1, plugins=BitsandbytesPrecision(mode="nf4", dtype=torch.bfloat16))
model = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.1"{load})
model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, optimizer = fabric.setup(model, optimizer)
for batch in []:
    fabric.backward(model(**batch).loss)
    optimizer.step()
'''


def _lightning_report(tmp_path, load: str) -> dict:
    path = tmp_path / "train.py"
    path.write_text(_FABRIC.format(load=load))
    text, _ = run_check(None, "python", [str(path)], dict(CURRENT_ALL), as_json=True)
    return json.loads(text)


def test_lightning_bnb_plugin_leaves_a_model_quantized_at_load_alone(tmp_path):
    # Lightning-AI/pytorch-lightning src/lightning/fabric/plugins/precision/bitsandbytes.py convert_module converts
    # only a module holding no bitsandbytes layer yet: a model loaded with BitsAndBytesConfig keeps PEFT's lora_A /
    # lora_B in float, so the plugin beside it does not freeze the adapters.
    quantized = _lightning_report(tmp_path, ", quantization_config=BitsAndBytesConfig(load_in_4bit=True)")
    assert quantized["setup"]["adapter_loaded_frozen"] is False
    assert "adapter-loaded-frozen" not in {f["rule"] for f in quantized["findings"]}
    plain = _lightning_report(tmp_path, ", torch_dtype=torch.bfloat16")  # the plugin converts lora_A / lora_B too
    assert plain["setup"]["adapter_loaded_frozen"] is True


_FSDP = """
import torch
import lightning as L
from lightning.fabric.strategies import FSDPStrategy
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaDecoderLayer
from peft import LoraConfig, get_peft_model

fabric = L.Fabric(devices=8, strategy=FSDPStrategy(activation_checkpointing_policy={LlamaDecoderLayer}),
                  precision="bf16-true")
model = get_peft_model(AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", use_cache=False),
                       LoraConfig(r=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
model, optimizer = fabric.setup(model, optimizer)
for batch in []:
    fabric.backward(model(**batch).loss)
    optimizer.step()
"""


def test_lightning_fsdp_strategy_takes_no_hf_trainer_find_unused_default(tmp_path):
    # Lightning-AI/pytorch-lightning#19721 shape: FSDPStrategy(activation_checkpointing_policy=...) on an HF model
    # with PEFT; FSDP has no find_unused_parameters, so the HF Trainer's PeftModel default (True) must not be shown
    # as the run's.
    path = tmp_path / "train.py"
    path.write_text(_FSDP)
    out = json.loads(run_check(None, "python", [str(path)], dict(CURRENT_ALL), as_json=True)[0])
    assert out["setup"]["engine"] == "fsdp1" and out["setup"]["find_unused_parameters"] is False
    assert "HF Trainer" not in out["sources"]["find_unused_parameters"]


def test_litgpt_config_hub_file_not_here_is_read_from_its_name():
    # Lightning-AI/litgpt#1604 and PR #1139 launch LitGPT's own configs from a clone: `--config
    # config_hub/finetune/gemma-2b/qlora.yaml`; every config_hub file sets precision: bf16-true, the qlora ones
    # quantize: bnb.nf4 and devices: 1.
    r = from_command(shlex.split("litgpt finetune_lora --devices 1 --config config_hub/finetune/gemma-2b/qlora.yaml"),
                     CURRENT)
    assert (r.setup.precision, r.setup.quantization, r.setup.world_size) == ("bf16", "4bit", 1) and r.unknown == []
    full = from_command(shlex.split("litgpt finetune_full --config config_hub/finetune/llama-2-7b/full.yaml"), CURRENT)
    assert full.setup.precision == "bf16" and any("devices" in u for u in full.unknown)
    # A user's own config path stays unread.
    own = from_command(shlex.split("litgpt finetune_lora --config my/qlora.yaml"), CURRENT)
    assert any("not here" in u for u in own.unknown)


def test_torchtune_builtin_config_checkpointing_both_ways_keeps_the_recipes_wrapper():
    # `tune run --nproc_per_node 2 lora_finetune_distributed --config llama3_2_vision/11B_qlora` (the header line of
    # pytorch/torchtune recipes/configs/llama3_2_vision/11B_qlora.yaml): the file is not here, so checkpointing is
    # evaluated both ways, and its "all" side is the recipes' non-reentrant checkpoint_wrapper inside each FSDP2 unit,
    # not transformers' checkpointing.
    r = from_command(shlex.split("tune run --nproc_per_node 2 lora_finetune_distributed --config "
                                 "llama3_2_vision/11B_qlora"), CURRENT)
    assert "checkpointing" in r.unsure
    assert (r.setup.checkpoint_impl, r.setup.reentrant, r.setup.checkpoint_outside_shard) == (
        "torch-wrapper", False, False)


_DS3_MODULE = '''
import torch
import lightning as L
from transformers import AutoModelForCausalLM
from peft import LoraConfig, get_peft_model


class LitLM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = None
        {init}

    def configure_model(self):
        if self.model is not None:
            return
        {configure}

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=2e-4)


trainer = L.Trainer(devices=8, strategy="deepspeed_stage_3", precision="16-mixed")
trainer.fit(LitLM())
'''
_LOAD = ('self.model = get_peft_model(AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-13b-hf"), '
         'LoraConfig(r=8, target_modules=["q_proj"]))')


def test_lightning_zero3_from_pretrained_in_configure_model_is_not_called_clean(tmp_path):
    # Lightning-AI/pytorch-lightning#19259: configure_model runs inside deepspeed's zero.Init under ZeRO-3, so
    # from_pretrained copies the checkpoint into [0]-sized partitions and stops with a size mismatch.
    path = tmp_path / "train.py"
    path.write_text(_DS3_MODULE.format(init="pass", configure=_LOAD))
    out = json.loads(run_check(None, "python", [str(path)], dict(CURRENT_ALL), as_json=True)[0])
    assert out["exit_code"] != 0 and "configure_model under ZeRO-3" in json.dumps(out)
    path.write_text(_DS3_MODULE.format(init=_LOAD, configure="pass"))  # loaded in __init__: what the thread says works
    out = json.loads(run_check(None, "python", [str(path)], dict(CURRENT_ALL), as_json=True)[0])
    assert "configure_model under ZeRO-3" not in json.dumps(out)


def test_torchtune_header_naming_the_recipe_with_with(tmp_path):
    # dangbert/thesis_app experiments/tuner/llama2_7B_qlora_single_device.yaml (a `tune cp` of torchtune's
    # llama2/7B_qlora_single_device): `# Config for single device QLoRA with lora_finetune_single_device.py`.
    path = tmp_path / "copy.yaml"
    path.write_text("# Config for multi-device QLoRA with lora_finetune_distributed.py\n" +
                    _TT_BODY.replace("llama3_3_70b", "qlora_llama3_3_70b").replace("custom_sharded_layers: "
                                                                                  "['tok_embeddings', 'output']\n", "")
                    .replace("fsdp_cpu_offload: False\n", ""))
    r = from_files("torchtune", [str(path)], CURRENT)
    assert (r.setup.engine, r.setup.quantization) == ("fsdp2", "4bit")
