"""`experts` in adapter.target_modules (issue 28): a mixture of experts' fused expert weights (3-D parameters in
transformers 5, which no module name reaches) get adapters through peft's target_parameters. On tiny Qwen2-MoE and
Mixtral built from their configs, run as `train` runs them (fp32, one process): the expert adapters train, the
base stays bit-identical, the saved adapter reloads with PEFT to the same logits, and recomputing the layers in
backward (checkpointing) gives the first step's gradients unchanged."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import first_batch, make_config, randomize_adapters

from loraflow.environment import detect_environment
from loraflow.errors import ConfigError
from loraflow.run.pipeline import build_run
from loraflow.plan import resolve
from loraflow.setup.checkpointing import checkpointed_blocks
from loraflow.locations import ASSETS
from loraflow.verify.sweep_models import model_dir

TARGETS = "adapter.target_modules=[q_proj,v_proj,experts]"
FUSED = ("experts.down_proj", "experts.gate_up_proj")  # the fused parameters of both families' expert blocks


def base_name(name: str) -> str:
    """A PEFT model's parameter name as the base model's state dict spells it."""
    return re.sub(r"\.base_layer", "", name.removeprefix("base_model.model."))


def expert_adapters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if ".experts." in n and "lora_" in n}


# PeftModel.from_pretrained reads transformers' deprecated is_gradient_checkpointing (peft 0.21, transformers 5.23).
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral"])
def test_experts_train_save_and_reload(family, chat_data, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    path = model_dir(family)
    config = make_config(path, TARGETS, "train.max_steps=2", "train.micro_batch_size=4", f"output.dir={tmp_path}",
                         f"data.train={chat_data[0]}")
    run = build_run(config, detect_environment(), tmp_path)
    experts = next(d for d in run.plan.decisions if d.key == "experts")
    assert experts.value.startswith("adapted: 2 fused blocks (experts;") and "`experts`" in experts.reason
    model = run.trainer.model
    adapters = expert_adapters(model)
    assert len(adapters) == 2 * 2 * 2  # 2 layers x (gate_up_proj, down_proj) x (lora_A, lora_B)
    start = {n: p.detach().clone() for n, p in adapters.items()}

    run.trainer.fit()
    changed = [n for n, p in adapters.items() if not torch.equal(p.detach(), start[n])]
    assert sorted(changed) == sorted(adapters), "every expert adapter weight trains"
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    pristine = base.state_dict()
    frozen = {base_name(n): p for n, p in model.named_parameters() if not p.requires_grad}
    assert {n for n in frozen if n.endswith(FUSED)} == {n for n in pristine if n.endswith(FUSED)}
    moved = [n for n, p in frozen.items() if not torch.equal(p.detach(), pristine[n])]
    assert not moved, f"frozen weights changed: {moved[:3]}"

    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert sorted(saved["target_parameters"]) == list(FUSED)
    assert sorted(saved["target_modules"]) == ["q_proj", "v_proj"]
    reloaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    batch = first_batch(run.tokenizer, chat_data[0])
    model.eval()
    with torch.no_grad():
        want = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        got = reloaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["qwen2_moe", "mixtral"])
def test_checkpointing_keeps_the_first_step_gradients(family, chat_data, tmp_path):
    """Each fused parameter's adapter is added inside the expert block's forward (a parametrization that lives for
    one call), so the recompute in backward must add it again, to the same weights, in either of torch's modes."""
    grads = {}
    for mode, extra in (("off", []), ("on", ["checkpointing.enabled=true"]),
                        ("reentrant", ["checkpointing.enabled=true", "checkpointing.reentrant=true"])):
        config = make_config(model_dir(family), TARGETS, "train.micro_batch_size=4", f"output.dir={tmp_path / mode}",
                             f"data.train={chat_data[0]}", *extra)
        run = build_run(config, detect_environment(), tmp_path / mode, adjust_model=randomize_adapters)
        assert [b for _, b in checkpointed_blocks(run.trainer.model)] == (["layer"] * 2 if extra else ["", ""])
        run.trainer.accumulate()
        grads[mode] = run.trainer.engine.full_grads()
    off = grads.pop("off")
    experts = [n for n in off if ".experts." in n]
    assert len(experts) == 8 and all(off[n] is not None and off[n].abs().sum() > 0 for n in experts)
    for mode, got in grads.items():
        assert got.keys() == off.keys()
        for name, want in off.items():
            torch.testing.assert_close(got[name], want, rtol=1e-6, atol=1e-9, msg=f"{mode}: {name}")


def test_experts_on_a_dense_model_is_refused():
    with pytest.raises(ConfigError, match=r"adapter.target_modules names `experts`, but this model has no fused "
                                          r"expert weights.*its linear layers are down_proj, gate_proj"):
        resolve(make_config(ASSETS / "tiny-base", "adapter.target_modules=[q_proj,experts]"), detect_environment())


@pytest.mark.parametrize("setting, key", [("adapter.method=dora", "adapter.method=dora"),
                                          ("adapter.dropout=0.1", "adapter.dropout=0.1")])
def test_what_peft_cannot_put_on_experts_is_refused(setting, key):
    """peft's parameter wrapper adds the adapter to the fused weight itself: no DoRA, no dropout on its input."""
    config = make_config(model_dir("qwen2_moe"), TARGETS, setting)
    with pytest.raises(ConfigError, match=rf"{re.escape(key)} with `experts` in adapter.target_modules.*remove "
                                          r"`experts` from adapter.target_modules"):
        resolve(config, detect_environment())


def test_all_linear_and_experts():
    """`experts` joins all-linear: Qwen2-MoE's shared expert and attention Linears and its fused experts."""
    plan = resolve(make_config(model_dir("qwen2_moe"), "adapter.target_modules=[all-linear,experts]"),
                   detect_environment())
    kinds = {m.rsplit(".", 1)[-1] for m in plan.model.adapter_modules}
    assert {"experts", "q_proj", "shared_expert_gate", "gate_proj"} <= kinds
    assert next(d for d in plan.decisions if d.key == "experts").value.startswith("adapted")
