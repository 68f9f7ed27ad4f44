"""`loraflow check` on scripts whose loop is Lightning's Trainer or Fabric (frontends/lightning.py): the strategy,
precision and devices come from `Trainer(...)`, read as Lightning 2.x defines them (strategies/ddp.py,
deepspeed.py, fsdp.py register_strategies; fabric/plugins/precision/precision.py), never with the HF Trainer's
defaults. Before this reader a `pl.Trainer(strategy="deepspeed_stage_3", devices=4)` script read as one fp32
process under transformers' Trainer. The scripts are written here, in the shape Lightning's docs give."""

from __future__ import annotations

import json

import pytest

from loraflow.frontends import parse_versions, run_check

TRANSFORMERS_4 = parse_versions("torch=2.3.0,transformers=4.40.0,peft=0.10.0,deepspeed=0.14.0,accelerate=0.30.0,"
                                "bitsandbytes=0.43.0")
CURRENT = parse_versions("torch=2.13.0,transformers=5.23.0,peft=0.21.2,deepspeed=0.19.8,accelerate=1.15.0,"
                         "bitsandbytes=0.50.2")

MODULE = '''
import torch
{imports}
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM


class LitLoRA({base}):
    def __init__(self):
        super().__init__()
        base = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf"{dtype})
        self.model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        {checkpointing}

    def training_step(self, batch, batch_idx):
        return self.model(**batch).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


{trainer}
trainer.fit(LitLoRA())
'''


def script(tmp_path, trainer: str, imports: str = "import lightning as L", base: str = "L.LightningModule",
           dtype: str = "", checkpointing: str = "self.model.gradient_checkpointing_enable()") -> str:
    path = tmp_path / "train.py"
    path.write_text(MODULE.format(imports=imports, base=base, dtype=dtype, checkpointing=checkpointing,
                                  trainer=trainer))
    return str(path)


def check(path: str, versions=CURRENT, argv: list[str] | None = None) -> dict:
    text, code = run_check(argv, None if argv else "python", [] if argv else [path], dict(versions), as_json=True)
    out = json.loads(text)
    assert out["exit_code"] == code
    return out


def fields(report: dict) -> dict:
    return report["setup"]


def rules(report: dict) -> set[str]:
    return {f["rule"] for f in report["findings"]}


def test_a_deepspeed_strategy_name_is_zero_with_lightnings_precision_and_devices(tmp_path):
    out = check(script(tmp_path, 'trainer = L.Trainer(devices=4, strategy="deepspeed_stage_3_offload", '
                                 'precision="16-mixed")'))
    got = fields(out)
    assert (got["engine"], got["zero_stage"], got["offload"], got["world_size"]) == ("deepspeed", 3, True, 4)
    assert got["precision"] == "fp16-mixed"
    assert out["sources"]["engine"].startswith("train.py:22: L.Trainer(strategy=")
    assert "transformers' Trainer" not in json.dumps(out["sources"])
    # Lightning calls deepspeed.initialize on the built module, whose fp16 engine casts it whole: no zero.Init model
    # with float32 adapters beside a half base, and no save_pretrained in the code to write an empty adapter.
    assert got["mixed_param_dtypes"] is False and got["adapter_save_gather"] is True


def test_a_save_pretrained_under_lightnings_zero3_writes_an_empty_adapter(tmp_path):
    path = script(tmp_path, 'trainer = L.Trainer(devices=2, strategy="deepspeed_stage_3", precision="bf16-mixed")')
    with open(path, "a") as f:
        f.write("model = LitLoRA()\nmodel.model.save_pretrained('out')\n")
    out = check(path)
    assert fields(out)["adapter_save_gather"] is False
    assert "zero3-empty-adapter-save" in rules(out)


def test_lightnings_ddp_keeps_torchs_find_unused_default(tmp_path):
    """The HF Trainer turns find_unused_parameters on for a PeftModel; Lightning's DDPStrategy does not, so reentrant
    checkpointing under DDP does not mark parameters ready twice unless the strategy asks for unused ones."""
    plain = check(script(tmp_path, 'trainer = L.Trainer(devices=2, strategy="ddp", precision="bf16-mixed")'),
                  TRANSFORMERS_4)
    got = fields(plain)
    assert (got["engine"], got["world_size"], got["find_unused_parameters"]) == ("ddp", 2, False)
    assert "Lightning's DDPStrategy" in plain["sources"]["find_unused_parameters"]
    assert "ddp-reentrant-unused" not in rules(plain)

    unused = check(script(tmp_path, 'trainer = L.Trainer(devices=2, strategy="ddp_find_unused_parameters_true")'),
                   TRANSFORMERS_4)
    assert fields(unused)["find_unused_parameters"] is True
    finding = next(f for f in unused["findings"] if f["rule"] == "ddp-reentrant-unused")
    assert finding["holds_if"] is None and unused["exit_code"] == 2
    assert any("DDPStrategy(find_unused_parameters" in fix for fix in finding["fix_here"])


def test_a_ddp_strategy_object_and_pytorch_lightning_imports(tmp_path):
    trainer = ("trainer = pl.Trainer(devices=[0, 1, 2], num_nodes=2, "
               "strategy=DDPStrategy(find_unused_parameters=True, static_graph=True))")
    out = check(script(tmp_path, trainer, imports="import pytorch_lightning as pl\n"
                       "from pytorch_lightning.strategies import DDPStrategy", base="pl.LightningModule"))
    got = fields(out)
    assert (got["world_size"], got["find_unused_parameters"], got["ddp_static_graph"]) == (6, True, True)


def test_fsdp_activation_checkpointing_is_torchs_wrapper_and_keeps_the_models_cache(tmp_path):
    trainer = ("trainer = L.Trainer(devices=8, precision='bf16-true', strategy=FSDPStrategy("
               "auto_wrap_policy={LlamaDecoderLayer}, activation_checkpointing_policy={LlamaDecoderLayer}))")
    out = check(script(tmp_path, trainer, imports="import lightning as L\nfrom lightning.pytorch.strategies import "
                       "FSDPStrategy\nfrom transformers.models.llama.modeling_llama import LlamaDecoderLayer",
                       checkpointing=""))
    got = fields(out)
    assert (got["engine"], got["checkpoint_impl"], got["reentrant"], got["precision"]) == (
        "fsdp1", "torch-wrapper", False, "bf16")
    assert got["use_cache"] is True and got["fsdp_use_orig_params"] is True
    # The model config's KV cache is on while torch's wrapper recomputes the layers: a silent finding.
    assert "cache-during-recompute" in rules(out)


def test_true_half_precision_and_an_unknown_precision(tmp_path):
    half = fields(check(script(tmp_path, "trainer = L.Trainer(precision='16-true')", checkpointing="")))
    assert (half["precision"], half["grad_scaler"], half["engine"], half["world_size"]) == ("fp16", False, "single", 1)
    odd = check(script(tmp_path, "trainer = L.Trainer(precision='transformer-engine')", checkpointing=""))
    assert any("transformer-engine" in line for line in odd["unknown"])


def test_devices_auto_leaves_the_process_count_open(tmp_path):
    out = check(script(tmp_path, "trainer = L.Trainer(strategy='ddp_find_unused_parameters_true')"), TRANSFORMERS_4)
    finding = next(f for f in out["findings"] if f["rule"] == "ddp-reentrant-unused")
    assert finding["holds_if"] == "several GPUs visible"


def test_a_python_launch_line_leaves_the_processes_to_lightning(tmp_path, monkeypatch):
    path = script(tmp_path, 'trainer = L.Trainer(devices=4, strategy="ddp_find_unused_parameters_true")')
    monkeypatch.chdir(tmp_path)
    out = check(path, TRANSFORMERS_4, argv=["python", "train.py"])
    assert fields(out)["world_size"] == 4
    assert "ddp-reentrant-unused" in rules(out)


def test_fabric_with_a_deepspeed_strategy_object(tmp_path):
    trainer = ("fabric = Fabric(devices=2, precision='bf16-mixed', strategy=DeepSpeedStrategy(stage=3, "
               "offload_parameters=True, offload_optimizer=True))\nfabric.launch()\ntrainer = fabric")
    path = tmp_path / "train.py"
    path.write_text(MODULE.format(imports="from lightning.fabric import Fabric\nfrom lightning.fabric.strategies "
                                  "import DeepSpeedStrategy", base="torch.nn.Module", dtype="",
                                  checkpointing="", trainer=trainer).replace("trainer.fit(LitLoRA())",
                                                                             "fabric.backward(loss)"))
    got = fields(check(str(path)))
    assert (got["engine"], got["zero_stage"], got["offload"], got["precision"], got["world_size"]) == (
        "deepspeed", 3, True, "bf16-mixed", 2)


@pytest.mark.parametrize("spelling", ["transformers==4.40.0", "transformers=4.40.0", "transformers=v4.40.0"])
def test_versions_read_pips_double_equals_too(spelling):
    assert str(parse_versions(spelling)["transformers"]) == "4.40.0"
