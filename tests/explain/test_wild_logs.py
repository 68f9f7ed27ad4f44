"""Misreadings found by sweeping logs people posted in issue threads (tests/fixtures/corpus/explain/wild/), each fixed
in general form: the class of log, not the one thread."""

from __future__ import annotations

from conftest import ROOT

from loraflow.explain import diagnose_log

WILD = ROOT / "tests" / "fixtures" / "corpus" / "explain" / "wild"


def _ids(text: str) -> list[str]:
    _, candidates, _ = diagnose_log(text)
    return [c.rule.id for c in candidates]


def test_a_raise_frame_the_traceback_went_past_is_not_where_the_log_stopped():
    # MemoRAG: cut in modeling_utils.from_pretrained -> dispatch_model, below auto_factory's from_pretrained. The
    # auto class resolved the model class (its refusal of an image-text config is raised in its own frame).
    text = (WILD / "12-memorag58-from-pretrained-dispatch-to-8bit.log").read_text()
    assert _ids(text) == []
    # Cut on auto_factory's frame itself, the same causal-LM load is still read as that refusal's raise path.
    cut = text[:text.index("  File \"/root/.cache")]
    assert "vlm-wrong-auto-class" in _ids(cut)


def test_a_quantized_model_refused_a_move_while_loading_is_neither_a_merge_nor_a_later_move():
    text = (WILD / "10-glm4voice152-windows-dispatch-model-to-4bit.log").read_text()
    assert _ids(text) == []
    # The bare refusal, with nothing to say where it was raised, keeps its known causes.
    assert set(_ids(text.splitlines()[-1])) >= {"kbit-merge", "kbit-model-moved"}


def test_ranks_records_pasted_without_their_line_breaks_are_read_one_a_line():
    from loraflow.explain.logread import view

    # StableAvatar: ZeRO-3 LoRA, rank 1's whole traceback on one line after rank 0's cut metadata record.
    log = view((WILD / "26-stableavatar36-zero3-ranks-glued-one-line-zh.log").read_text())
    assert len(log.frames) == 7 and log.shape == "truncated"
    assert any(line.startswith("[rank0]: saved met") for line in log.lines)
    # One rank prefix on a line, or a `[rank` inside a message, is left as it is.
    assert len(view("[rank0]: RuntimeError: bad [rank] index").lines) == 1


def test_a_size_zero_operand_in_a_backward_pass_is_not_a_merge():
    # Lightning deepspeed_stage_3_offload (pytorch-lightning#17605): raised under the autograd engine, so no merge.
    text = ("Variable._execution_engine.run_backward(tensors, grad_tensors_, retain_graph, create_graph, inputs, "
            "allow_unreachable=True, accumulate_grad=True)\n\nRuntimeError: The size of tensor a (0) must match the "
            "size of tensor b (320) at\nnon-singleton dimension 1")
    assert not {"zero3-lora-merge", "dora-sharded-weight"} & set(_ids(text))
    # The same message with a merge on the traceback is still the merge.
    merged = ('  File "peft/tuners/lora/model.py", line 440, in _unload_and_optionally_merge\n'
              '    target.merge(safe_merge=safe_merge)\nRuntimeError: The size of tensor a (0) must match the size of '
              'tensor b (4096) at non-singleton dimension 1')
    assert _ids(merged)[:1] == ["zero3-lora-merge"]
