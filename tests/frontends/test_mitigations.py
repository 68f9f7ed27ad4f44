"""Frameworks' own workarounds by release (Framework.mitigations): each names rules of the registry and a release,
frontends decide with them through common.mitigated, and docs/mitigations.md is generated from them."""

from __future__ import annotations

import json
import shlex

import pytest
from conftest import ROOT
from packaging.version import Version

from loraflow.frontends import run_check
from loraflow.frontends.base import frameworks
from loraflow.frontends.common import Draft, mitigated
from loraflow.frontends.mitigations import render_markdown
from loraflow.rules import all_rules


def test_every_mitigation_names_known_rules_and_a_release_and_the_docs_are_fresh():
    ids = {r.id for r in all_rules()}
    declared = [(f, m) for f in frameworks() for m in f.mitigations]
    assert len(declared) >= 8
    for f, m in declared:
        assert set(m.rules) <= ids and Version(m.since) and m.source and m.how, (f.name, m)
    assert (ROOT / "docs" / "mitigations.md").read_text() == render_markdown(), "run scripts/gen_docs.py"


def test_mitigated_reads_the_framework_s_release_and_refuses_an_undeclared_rule():
    old, new = Draft("axolotl", {"axolotl": Version("0.3.0")}), Draft("axolotl", {"axolotl": Version("0.4.0")})
    assert not mitigated(old, "kbit-merge") and mitigated(new, "kbit-merge")
    unknown = Draft("axolotl", {})
    assert mitigated(unknown, "kbit-merge") and Version("0.4.0") in unknown.queried["axolotl"]  # both sides evaluated
    with pytest.raises(KeyError, match="declares no mitigation of fp16-overflow"):
        mitigated(new, "fp16-overflow")


def test_a_release_before_the_workaround_gets_the_finding_and_an_unknown_one_names_the_release(monkeypatch):
    monkeypatch.chdir(ROOT / "tests" / "fixtures" / "frontends" / "axolotl")
    line = shlex.split("python -m axolotl.cli.merge_lora code-llama-7b-qlora.yml")
    doc = json.loads(run_check(line, None, [], {}, True)[0])
    merge = [f for f in doc["findings"] if f["rule"] == "kbit-merge"]
    assert merge and "axolotl<0.4.0" in merge[0]["holds_if"] and doc["exit_code"] == 1


@pytest.mark.parametrize("versions, holds", [
    ("llama-factory=0.5.3,transformers=4.40.0,bitsandbytes=0.43.1", True),   # before LLaMA-Factory passed the dtype
    ("llama-factory=0.6.3,transformers=4.38.2,bitsandbytes=0.43.1", True),   # passed, but transformers ignores it
    ("llama-factory=0.6.3,transformers=4.40.0,bitsandbytes=0.42.0", True),   # bitsandbytes cannot store it
    ("llama-factory=0.6.3,transformers=4.40.0,bitsandbytes=0.43.1", False),
])
def test_llama_factory_qlora_under_fsdp_needs_its_storage_release_and_transformers_that_reads_it(
        tmp_path, versions, holds):
    """LLaMA-Factory's FSDP+QLoRA example of the train_bash era (examples/extras/fsdp_qlora/sft.sh pins
    transformers>=4.39.1 and bitsandbytes>=0.43.0); LlamaFactory#3470 ran it and FSDP refused the uint8 weights."""
    (tmp_path / "fsdp_config.yaml").write_text("distributed_type: FSDP\nnum_processes: 2\nmixed_precision: fp16\n"
                                               "fsdp_config:\n  fsdp_use_orig_params: true\n")
    line = shlex.split(f"accelerate launch --config_file {tmp_path}/fsdp_config.yaml src/train_bash.py --stage sft "
                       "--do_train --model_name_or_path meta-llama/Llama-2-70b-hf --finetuning_type lora "
                       "--lora_target q_proj,v_proj --quantization_bit 4 --fp16")
    from loraflow.frontends import parse_versions

    doc = json.loads(run_check(line, None, [], dict(parse_versions(versions)), True)[0])
    found = [f for f in doc["findings"] if f["rule"] == "qlora-storage-dtype"]
    assert bool(found) == holds, doc["findings"]
    if holds:
        assert found[0]["holds_if"] is None and doc["exit_code"] == 2
