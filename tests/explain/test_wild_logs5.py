"""The fifth sweep of logs posted in issue threads (tests/fixtures/corpus/explain/wild5/): generic one-line errors
(dtype mismatches, `Expected all tensors to be on the same device`, NCCL timeouts, OOM) with or without the frames and
settings around them, logs cut before their error line, and decoys with look-alike errors. Two misreadings were
found: notebook (IPython) frames name the function with its class (`Linear8bitLt.forward`), which no raise-path
pattern matched; and an 8-bit base, which lora-dtype-mismatch's conditions name, did not count for it."""

from __future__ import annotations

import json

from conftest import ROOT

from loraflow.explain import diagnose_log, view
from loraflow.explain.facts import read_facts

WILD5 = ROOT / "tests" / "fixtures" / "corpus" / "explain" / "wild5"


def _found(text: str) -> list[tuple[str, str]]:
    _, candidates, _ = diagnose_log(text)
    return [(c.rule.id, c.confidence) for c in candidates]


# The shape of A-baoYang/alpaca-7b-chinese#4: a notebook's traceback of LoRA on an 8-bit base, cut inside PEFT's
# 8-bit LoRA layer (IPython prints `File path:line, in Class.method(args)`).
_NOTEBOOK_8BIT = """\
File ~/env/lib/python3.9/site-packages/torch/nn/modules/module.py:1501, in Module._call_impl(self, *args, **kwargs)
-> 1501     return forward_call(*args, **kwargs)

File ~/env/lib/python3.9/site-packages/peft/tuners/lora.py:710, in Linear8bitLt.forward(self, x)
    706     if x.dtype != torch.float32:
    707         x = x.float()
--> 710             self.lora_A[self.active_adapter](self.lora_dropout[self.active_adapter](x))
"""


def test_notebook_frames_match_by_their_bare_function_name():
    frame = [f for f in view(_NOTEBOOK_8BIT).frames if f.path.endswith("lora.py")][0]
    assert frame.function == "Linear8bitLt.forward"
    assert frame.wheres[-1].endswith("peft/tuners/lora.py:forward")
    # The cut inside the 8-bit LoRA layer's forward is lora-dtype-mismatch's raise path.
    assert _found(_NOTEBOOK_8BIT)[:1] == [("lora-dtype-mismatch", "likely")]


def test_notebook_frame_facts_read_class_qualified_names():
    # bitsandbytes/bitsandbytes#430's notebook form: `in LoraModel.merge_and_unload(self)`.
    log = view("File ~/env/lib/python3.10/site-packages/peft/tuners/lora.py:352, in LoraModel.merge_and_unload(self)\n"
               "File ~/env/lib/python3.10/site-packages/transformers/generation/utils.py:1462, in "
               "GenerationMixin.generate(self, inputs)\n")
    facts = read_facts(log)
    assert "merge_frames" in facts and "generate_frames" in facts
    # Prose that mentions a method is not a frame.
    assert "merge_frames" not in read_facts(view("I call model.merge_and_unload() in the script\n"))


def test_an_8bit_base_counts_for_the_lora_dtype_mismatch():
    # The shape of Facico/Chinese-Vicuna#205 and ssbuild/moss_finetuning#16: LoRA on an 8-bit base under DeepSpeed
    # fp16, whose engine casts the adapters to half while peft < 0.6.0's 8-bit layer feeds them float32.
    text = ("model = LlamaForCausalLM.from_pretrained(args.model_path, load_in_8bit=True, device_map=device_map)\n"
            "[INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: version=0.9.2\n"
            "RuntimeError: expected scalar type Float but found Half\n")
    assert _found(text)[:1] == [("lora-dtype-mismatch", "likely")]
    # With a PEFT release that casts (0.6.0 and later) the same log is not this failure.
    assert _found(text + "peft==0.7.1\n") == []


def test_wild5_decoys_claim_nothing():
    manifest = json.loads((WILD5 / "MANIFEST.json").read_text())
    for name, meta in manifest.items():
        if meta["decoy"]:
            assert _found((WILD5 / name).read_text()) == [], name


def test_wild5_failures_are_named_or_left_unclaimed():
    # Every failure log gets its rule first, except the ones whose excerpt holds no trace of it (cut before the
    # error, or a generic one-liner with nothing around it): those must not get a wrong claim.
    manifest = json.loads((WILD5 / "MANIFEST.json").read_text())
    for name, meta in manifest.items():
        if meta["decoy"]:
            continue
        found = _found((WILD5 / name).read_text())
        if meta["expected"] is None:  # a failure no rule covers (ZeRO-3 placeholders in a model outside the engine)
            assert found == [], name
        elif meta.get("evidence_in_log") is False:
            assert not found or found[0][0] == meta["expected"], name
        else:
            assert found and found[0][0] == meta["expected"], name
