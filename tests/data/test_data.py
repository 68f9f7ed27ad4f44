"""Data: bad records are named by file, line and field; labels cover only learned tokens; truncation is counted;
packing keeps samples apart."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from conftest import make_config, plan_and_model, reverse_records, write_jsonl
from loraflow.data import load_sft, read_records
from loraflow.data.batching import as_rows, collate, pack, truncate
from loraflow.data.formatting import IGNORE, eval_prompt, tokenize
from loraflow.errors import DataError
from loraflow.losses import token_nll
from loraflow.setup.model import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(make_config(tiny_model), str(tiny_model))


def test_malformed_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a", "completion": \n')
    with pytest.raises(DataError, match=r"d.jsonl line 2: not valid JSON"):
        read_records(str(path), "data.train", "train")


def test_missing_field_names_record_and_field(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "only"}])
    records = read_records(str(path), "data.train", "train")
    tokenize(records[0], "auto", tokenizer)
    with pytest.raises(DataError, match=r"d.jsonl line 2: field `completion` must be a string, got missing"):
        tokenize(records[1], "auto", tokenizer)


def test_bad_role_is_named(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": [{"role": "bot", "content": "x"}]}])
    with pytest.raises(DataError, match=r"line 1: field `messages\[0\].role` must be one of"):
        tokenize(read_records(str(path), "data.train", "train")[0], "auto", tokenizer)


def test_unknown_record_shape(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "d.jsonl", [{"body": "hello", "n": 3}])
    with pytest.raises(DataError, match=r"line 1: this record matches no supervised \(sft\) data format \(its keys: "
                                        r"body, n\)"):
        tokenize(read_records(str(path), "data.train", "train")[0], "auto", tokenizer)


def test_missing_data_file(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        read_records(str(tmp_path / "missing.jsonl"), "data.train", "train")


def test_json_and_parquet_read_the_same_records(tmp_path):
    records = reverse_records(3, 0)
    (tmp_path / "d.json").write_text(json.dumps(records))
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "d.parquet")
    from_json = [r.data for r in read_records(str(tmp_path / "d.json"), "data.train", "train")]
    from_parquet = [r.data for r in read_records(str(tmp_path / "d.parquet"), "data.train", "train")]
    assert from_json == records == from_parquet


def test_chat_labels_cover_exactly_the_assistant_turns(tmp_path, tokenizer):
    rec = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                        {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"},
                        {"role": "assistant", "content": "ok"}]}
    sample = tokenize(read_records(str(write_jsonl(tmp_path / "c.jsonl", [rec])), "d", "t")[0], "auto", tokenizer)
    learned = tokenizer.decode([t for t in sample.labels if t != IGNORE])
    assert learned == "yo<|end|>ok<|end|>"  # each assistant turn and its end-of-turn marker, nothing else


def test_prompt_completion_labels_and_eval_prompt(tmp_path, tokenizer):
    rec = read_records(str(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Q: ab ", "completion": "ba"}])),
                       "d", "t")[0]
    sample = tokenize(rec, "auto", tokenizer)
    assert tokenizer.decode([t for t in sample.labels if t != IGNORE]) == "ba<|end|>"
    prompt = eval_prompt(rec, "auto", tokenizer)
    assert tokenizer.decode(prompt.prompt_ids) == "Q: ab " and prompt.reference == "ba"


def test_truncation_is_counted_and_empty_samples_dropped(tmp_path, tiny_model, tokenizer):
    long = {"prompt": "x" * 40, "completion": "y" * 10}
    short = {"prompt": "p", "completion": "c"}
    path = write_jsonl(tmp_path / "t.jsonl", [long, short, {"prompt": "z" * 60, "completion": "w"}])
    config = make_config(tiny_model, f"data.train={path}", "data.eval=", "data.max_length=45")
    split, _ = load_sft(config, tokenizer)
    assert (split.stats.samples, split.stats.truncated, split.stats.dropped) == (2, 2, 1)
    assert "1 dropped" in split.stats.describe("train", 45) and "t.jsonl line 3" in split.stats.describe("train", 45)


def test_packed_batch_gives_the_same_per_sample_loss(tiny_model, chat_data):
    plan, model, tokenizer = plan_and_model(tiny_model, "data.packing=true", data=chat_data)
    samples, _ = truncate([tokenize(r, "auto", tokenizer) for r in read_records(str(chat_data[0]), "d", "t")[:6]],
                          512)
    model.eval()
    with torch.no_grad():
        unpacked = []
        for s in samples:
            batch = collate(as_rows([s]), tokenizer.pad_token_id)
            nll, mask = token_nll(model(input_ids=batch["input_ids"], use_cache=False).logits, batch["labels"])
            unpacked.append(float(nll[mask].sum()))
        rows = pack(samples, 512)
        assert len(rows) == 1  # all six share one row
        batch = collate(rows, tokenizer.pad_token_id)
        assert "attention_mask" not in batch
        nll, mask = token_nll(model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                                    use_cache=False).logits, batch["labels"])
    per_token = nll[0]
    packed, offset = [], 0
    for s in samples:  # loss positions of sample k: its own tokens, predicted from inside the sample
        n = len(s.input_ids)
        packed.append(float(per_token[offset: offset + n - 1][mask[0, offset: offset + n - 1]].sum()))
        offset += n
    assert packed == pytest.approx(unpacked, rel=1e-5)

    # What the rule packing-cache-cross-attention prevents: with the model's default use_cache=True,
    # transformers skips packed-sequence detection and later samples attend to earlier ones.
    with torch.no_grad():
        leaky = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=True).logits
        clean = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
    second = slice(len(samples[0].input_ids), None)
    assert (leaky[0, second] - clean[0, second]).abs().max() > 1e-3
