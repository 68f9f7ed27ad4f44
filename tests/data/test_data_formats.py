"""Data formats people bring (alpaca, sharegpt, plain text, TRL preference formats), column mapping, weighted
mixing of several files, a held-out fraction of data.train, and non-UTF-8 files. Each format must give exactly the
token ids and labels of the equivalent `messages` or prompt/completion record, and each must train."""

from __future__ import annotations

import copy
import json
import logging
import re
from pathlib import Path

import pytest
from conftest import make_config, write_jsonl

from loraflow.config import load_config
from loraflow.data import load_sft, read_splits
from loraflow.data.formatting import IGNORE, tokenize
from loraflow.data.preference import tokenize_pair
from loraflow.data.readers import Record
from loraflow.errors import DataError
from loraflow.locations import ASSETS
from loraflow.setup.model import load_tokenizer

REVERSE = ASSETS / "reverse"
# The training runs' lengths and floors, measured on CPU with train.seed=0 (2026-11): SFT at 100 steps reached exact
# match 0.38 and at 150 steps 1.00; text eval loss fell 7.33 -> 1.79 in 30 steps (1.25 in 60); DPO reward accuracy 0.96 after 40
# steps (0 before). The floors leave room for numeric drift across torch builds.
# 150 of the demo's 400 steps: enough to show both formats train, not always enough to finish. Seeds 0-3 with the
# head at learned positions or on full logits ended at exact match 1.00 five times of eight, and 0.20-0.40 (eval loss
# 0.20-0.40, a plateau more steps did not leave) the other three; float-level differences alone decide which.
SFT_STEPS, SFT_EXACT_MATCH, SFT_EVAL_LOSS = 150, 0.2, 0.5
TEXT_STEPS, TEXT_LOSS_DROP, TEXT_PHRASE = 30, 4.0, "reverse {word}: {answer}."
DPO_STEPS, DPO_ACCURACY = 40, 0.85
USER, ANSWER = "Please write the word kelmu backwards.", "umlek"
CHAT = {"messages": [{"role": "user", "content": USER}, {"role": "assistant", "content": ANSWER}]}


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return load_tokenizer(make_config(tiny_model), str(tiny_model))


def same_sample(record: dict, reference: dict, tokenizer, fmt: str = "auto") -> None:
    got, want = tokenize(Record(record, "got"), fmt, tokenizer), tokenize(Record(reference, "want"), "auto", tokenizer)
    assert got.input_ids == want.input_ids and got.labels == want.labels
    assert any(t != IGNORE for t in got.labels)


def test_alpaca_equals_the_chat_record(tokenizer):
    same_sample({"instruction": USER, "input": "", "output": ANSWER}, CHAT, tokenizer)
    same_sample({"instruction": USER, "output": ANSWER}, CHAT, tokenizer, fmt="alpaca")
    # input goes on a new line after the instruction; system becomes a system turn
    same_sample({"instruction": "Reverse this word.", "input": "kelmu", "output": ANSWER, "system": "Be brief."},
                {"messages": [{"role": "system", "content": "Be brief."},
                              {"role": "user", "content": "Reverse this word.\nkelmu"},
                              {"role": "assistant", "content": ANSWER}]}, tokenizer)


def test_alpaca_without_a_chat_template_is_prompt_completion(tokenizer):
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    same_sample({"instruction": "Reverse this word.", "input": "kelmu", "output": ANSWER},
                {"prompt": "Reverse this word.\nkelmu", "completion": ANSWER}, plain)


def test_sharegpt_and_openai_extras_equal_the_chat_record(tokenizer):
    turns = [{"from": "human", "value": USER}, {"from": "gpt", "value": ANSWER}]
    same_sample({"conversations": turns}, CHAT, tokenizer)
    same_sample({"conversation": turns, "id": "x1"}, CHAT, tokenizer)
    with_extras = {"messages": [{"role": "user", "content": USER, "name": "ann"},
                                {"role": "assistant", "content": ANSWER, "weight": 1}]}
    same_sample(with_extras, CHAT, tokenizer)
    # OpenAI's fine-tuning format: an assistant turn with weight 0 is context, not learned
    two = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "wrong", "weight": 0},
                        {"role": "user", "content": USER}, {"role": "assistant", "content": ANSWER}]}
    learned = [t for t in tokenize(Record(two, "x"), "auto", tokenizer).labels if t != IGNORE]
    assert tokenizer.decode(learned).startswith(ANSWER) and "wrong" not in tokenizer.decode(learned)


def test_text_learns_every_token_and_ends_with_eos(tokenizer):
    sample = tokenize(Record({"text": "the word kelmu backwards is umlek."}, "x"), "auto", tokenizer)
    assert sample.labels == sample.input_ids and sample.input_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(sample.input_ids[:-1]) == "the word kelmu backwards is umlek."


PROMPT = [{"role": "user", "content": USER}]
LEGACY_PAIR = {"prompt": PROMPT, "chosen": ANSWER, "rejected": "kelmu"}


def test_trl_preference_formats_equal_the_legacy_pair(tokenizer):
    """https://huggingface.co/docs/trl/dataset_formats#preference: conversational explicit and implicit prompt,
    and the standard (string) implicit prompt split as trl.data_utils.extract_prompt splits it."""
    want = tokenize_pair(Record(LEGACY_PAIR, "want"), tokenizer)
    explicit = {"prompt": PROMPT, "chosen": [{"role": "assistant", "content": ANSWER}],
                "rejected": [{"role": "assistant", "content": "kelmu"}]}
    implicit = {"chosen": [*PROMPT, {"role": "assistant", "content": ANSWER}],
                "rejected": [*PROMPT, {"role": "assistant", "content": "kelmu"}]}
    for record in (explicit, implicit):
        got = tokenize_pair(Record(record, "got"), tokenizer)
        assert (got.chosen, got.rejected) == (want.chosen, want.rejected)
    standard = tokenize_pair(Record({"chosen": "The sky is blue.", "rejected": "The sky is green."}, "s"), tokenizer)
    split = tokenize_pair(Record({"prompt": "The sky is", "chosen": " blue.", "rejected": " green."}, "s"), tokenizer)
    assert (standard.chosen, standard.rejected) == (split.chosen, split.rejected)


def test_implicit_pair_without_a_shared_prompt_is_refused(tokenizer):
    with pytest.raises(DataError, match=r"line 3: `chosen` and `rejected` share no leading messages.*`prompt`"):
        tokenize_pair(Record({"chosen": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                              "rejected": [{"role": "user", "content": "c"},
                                           {"role": "assistant", "content": "d"}]}, "f line 3"), tokenizer)


def config_for(tiny_model, *overrides: str):
    return make_config(tiny_model, "data.eval=", *overrides)


def test_each_file_logs_its_detected_format(tiny_model, tokenizer, tmp_path, caplog):
    alpaca = write_jsonl(tmp_path / "a.jsonl", [{"instruction": USER, "input": "", "output": ANSWER}] * 3)
    share = write_jsonl(tmp_path / "s.jsonl", [{"conversations": [{"from": "human", "value": USER},
                                                                  {"from": "gpt", "value": ANSWER}]}] * 3)
    with caplog.at_level(logging.INFO, logger="loraflow"):
        train, _ = load_sft(config_for(tiny_model, f"data.train={alpaca}"), tokenizer)
        load_sft(config_for(tiny_model, f"data.train=[{alpaca},{share}]"), tokenizer)
    assert f"data.train: {alpaca} read as alpaca (instruction/input/output)" in caplog.messages
    assert f"data.train[1]: {share} read as sharegpt (conversations)" in caplog.messages
    assert len(train.rows) == 3


def test_refusal_lists_formats_and_suggests_a_mapping_that_works(tiny_model, tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", [{"question": USER, "answer": ANSWER, "id": 1}])
    with pytest.raises(DataError) as caught:
        load_sft(config_for(tiny_model, f"data.train={path}"), tokenizer)
    message = str(caught.value)
    assert f"{path} line 1: this record matches no supervised (sft) data format (its keys: answer, id, question)" \
        in message
    assert "alpaca: instruction, output (optional: input, system)" in message and "text: text" in message
    suggested = re.search(r"set (data\.columns=\[[^\]]*\])", message).group(1)
    assert suggested == "data.columns=[question=prompt,answer=completion]"
    train, _ = load_sft(config_for(tiny_model, f"data.train={path}", suggested), tokenizer)
    want = tokenize(Record({"prompt": USER, "completion": ANSWER}, "w"), "auto", tokenizer)
    assert train.rows[0].input_ids == want.input_ids and train.rows[0].labels == want.labels


def test_a_forced_format_that_does_not_fit_suggests_the_one_that_does(tiny_model, tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", [CHAT])
    with pytest.raises(DataError, match=r"data.format=alpaca needs instruction, output.*keys: messages") as caught:
        load_sft(config_for(tiny_model, f"data.train={path}", "data.format=alpaca"), tokenizer)
    suggested = re.search(r"set (data\.format=\w+)", str(caught.value)).group(1)
    assert suggested == "data.format=messages"
    assert load_sft(config_for(tiny_model, f"data.train={path}", suggested), tokenizer)[0].stats.samples == 1
    with pytest.raises(DataError, match=r"data.format=preference is a preference-pair \(rm, dpo\) format"):
        load_sft(config_for(tiny_model, f"data.train={path}", "data.format=preference"), tokenizer)


def test_pair_refusal_suggests_a_mapping_that_works(tiny_model, tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"question": "Q?", "good": "yes", "bad": "no"}])
    config = config_for(tiny_model, f"data.train={path}")
    with pytest.raises(DataError, match=r"preference: prompt, chosen, rejected.*preference_implicit: chosen") as c:
        read_splits(config, "pairs", True)
    suggested = re.search(r"set (data\.columns=\[[^\]]*\])", str(c.value)).group(1)
    assert suggested == "data.columns=[question=prompt,good=chosen,bad=rejected]"
    records, _ = read_splits(config_for(tiny_model, f"data.train={path}", suggested), "pairs", True)
    tokenize_pair(records[0], tokenizer)


def test_a_column_mapping_nothing_uses_is_refused(tiny_model, tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [CHAT])
    with pytest.raises(DataError, match=r"data.columns: no record has the key of qestion=prompt"):
        read_splits(config_for(tiny_model, f"data.train={path}", "data.columns=[qestion=prompt]"), "sft", True)
    with pytest.raises(DataError, match=r"data.columns\[0\]='question' must be SOURCE=TARGET"):
        read_splits(config_for(tiny_model, f"data.train={path}", "data.columns=[question]"), "sft", True)


def numbered(path: Path, n: int, tag: str) -> Path:
    return write_jsonl(path, [{"prompt": f"{tag}{i} ", "completion": "x"} for i in range(n)])


def test_mixing_weights_repeat_and_subsample_deterministically(tiny_model, tmp_path):
    a, b, c = numbered(tmp_path / "a.jsonl", 10, "a"), numbered(tmp_path / "b.jsonl", 10, "b"), \
        numbered(tmp_path / "c.jsonl", 10, "c")
    spec = f"data.train=[{a}*2, {b}*0.3, {c}*1.5]"
    records, _ = read_splits(config_for(tiny_model, spec), "sft", True)
    by_file = {name: [r for r in records if r.origin.startswith(str(tmp_path / name))] for name in "abc"}
    assert [len(by_file[n]) for n in "abc"] == [20, 3, 15]
    assert sorted(r.origin for r in by_file["a"]) == sorted([f"{a} line {i}" for i in range(1, 11)] * 2)
    assert len({r.origin for r in by_file["c"]}) == 10  # every record once, five of them twice
    again, _ = read_splits(config_for(tiny_model, spec), "sft", True)
    other, _ = read_splits(config_for(tiny_model, spec, "train.seed=7"), "sft", True)
    assert [r.origin for r in again] == [r.origin for r in records]
    assert [r.origin for r in other] != [r.origin for r in records]


def test_each_mixed_file_keeps_its_format_and_its_error_origins(tiny_model, tmp_path):
    chat = write_jsonl(tmp_path / "chat.jsonl", [CHAT] * 2)
    alpaca = write_jsonl(tmp_path / "alpaca.jsonl", [{"instruction": USER, "output": ANSWER},
                                                     {"instruction": USER, "response": ANSWER}])
    with pytest.raises(DataError, match=re.escape(f"{alpaca} line 2: field `output` must be a non-empty string "
                                                  "(alpaca format), got missing")):
        read_splits(config_for(tiny_model, f"data.train=[{chat}, {alpaca}*2]"), "sft", True)


def test_weight_syntax_and_bad_weights(tiny_model, tmp_path):
    path = numbered(tmp_path / "a.jsonl", 4, "a")
    with pytest.raises(DataError, match=r"data.train\[1\]='.*\*0': a mixing weight must be above 0"):
        read_splits(config_for(tiny_model, f"data.train=[{path}, {path}*0]"), "sft", True)
    # the builtin: prefix keeps working, with or without a weight
    records, _ = read_splits(config_for(tiny_model, "data.train=builtin:reverse/eval.jsonl*0.5"), "sft", True)
    assert len(records) == 50 and records[0].origin.startswith(str(REVERSE / "eval.jsonl"))


def test_held_out_fraction_is_disjoint_seeded_and_logged(tiny_model, tokenizer, tmp_path, caplog):
    path = numbered(tmp_path / "a.jsonl", 40, "a")
    with caplog.at_level(logging.INFO, logger="loraflow"):
        train, held = read_splits(config_for(tiny_model, f"data.train={path}", "data.eval_split=0.1"), "sft", True)
    assert len(held) == 4 and len(train) == 36
    assert not {r.origin for r in train} & {r.origin for r in held}
    assert any("held out 4 of 40 data.train records as the eval set (seed train.seed=0); 36 left" in m
               for m in caplog.messages)
    again = read_splits(config_for(tiny_model, f"data.train={path}", "data.eval_split=0.1"), "sft", True)[1]
    other = read_splits(config_for(tiny_model, f"data.train={path}", "data.eval_split=0.1", "train.seed=3"),
                        "sft", True)[1]
    assert [r.origin for r in again] == [r.origin for r in held] != [r.origin for r in other]
    tiny = read_splits(config_for(tiny_model, f"data.train={path}", "data.eval_split=0.001"), "sft", True)[1]
    assert len(tiny) == 1
    _, split = load_sft(config_for(tiny_model, f"data.train={path}", "data.eval_split=0.25"), tokenizer)
    assert split is not None and len(split.rows) == 10 and len(split.prompts) == 10


def test_held_out_fraction_and_an_eval_file_conflict(tiny_model, tmp_path):
    path = numbered(tmp_path / "a.jsonl", 4, "a")
    with pytest.raises(DataError, match=r"data.eval_split=0.5 holds out part of data.train.*Set data.eval= \(empty"):
        read_splits(make_config(tiny_model, f"data.train={path}", f"data.eval={path}", "data.eval_split=0.5"),
                    "sft", True)
    with pytest.raises(DataError, match=r"data.eval_split=1.5: a held-out fraction must be between 0 and 1"):
        read_splits(config_for(tiny_model, f"data.train={path}", "data.eval_split=1.5"), "sft", True)
    # a name keeps its hub-split meaning: an eval file is read, nothing is held out
    train, held = read_splits(make_config(tiny_model, f"data.train={path}", f"data.eval={path}",
                                          "data.eval_split=test"), "sft", True)
    assert len(train) == len(held) == 4


def test_text_eval_measures_loss_only_and_packs(tiny_model, tokenizer, tmp_path, caplog):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": f"the word w{i} backwards is {i}w."} for i in range(8)])
    with caplog.at_level(logging.INFO, logger="loraflow"):
        train, held = load_sft(config_for(tiny_model, f"data.train={path}", f"data.eval={path}",
                                          "data.packing=true", "data.max_length=64"), tokenizer)
    assert held.prompts == [] and len(held.rows) == 8
    assert len(train.rows) < 8 and all(r.position_ids is not None for r in train.rows)
    assert any("8 of 8 records are plain text with no reference answer" in m and "loss only" in m
               for m in caplog.messages)


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_non_utf8_bytes_name_file_line_offset_and_the_fix(tiny_model, tmp_path, suffix):
    path = tmp_path / f"latin1{suffix}"
    first = json.dumps({"text": "ok"})
    if suffix == ".jsonl":
        path.write_bytes(f"{first}\n".encode() + '{"text": "café"}\n'.encode("latin-1"))
    else:
        path.write_bytes(f"[{first},\n".encode() + '{"text": "café"}]\n'.encode("latin-1"))
    offset = len(f"[{first},\n" if suffix == ".json" else f"{first}\n") + len('{"text": "caf')
    with pytest.raises(DataError) as caught:
        read_splits(config_for(tiny_model, f"data.train={path}"), "sft", True)
    message = str(caught.value)
    assert message.startswith(f"{path} line 2: not UTF-8 (bytes b'\\xe9' at byte offset {offset} of the file)")
    assert f"iconv -f latin1 -t utf-8 {path}" in message


def test_utf8_byte_order_mark_is_accepted(tiny_model, tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"text": "ok"}).encode() + b"\n")
    assert read_splits(config_for(tiny_model, f"data.train={path}"), "sft", True)[0][0].data == {"text": "ok"}


def test_data_train_accepts_a_list_in_yaml(tmp_path):
    (tmp_path / "c.yaml").write_text("data:\n  train: [a.jsonl, b.jsonl*0.3]\n  eval_split: 0.05\n")
    config = load_config(tmp_path / "c.yaml")
    assert config.data.train == ["a.jsonl", "b.jsonl*0.3"] and config.data.eval_split == "0.05"


# --- each new format trains ------------------------------------------------------------------------------------

def reverse_chat(name: str) -> list[dict]:
    return [json.loads(line) for line in (REVERSE / name).read_text().splitlines() if line.strip()]


def as_alpaca(record: dict) -> dict:
    user, answer = record["messages"]
    return {"instruction": user["content"], "input": "", "output": answer["content"]}


def as_sharegpt(record: dict) -> dict:
    speaker = {"user": "human", "assistant": "gpt", "system": "system"}
    return {"conversations": [{"from": speaker[m["role"]], "value": m["content"]} for m in record["messages"]]}


def run_demo(stage: str, tmp_path: Path, *overrides: str) -> dict:
    from loraflow.run.config import demo_config
    from loraflow.run.train import train

    return train(stage, str(demo_config(stage)), [*overrides, f"output.dir={tmp_path / 'run'}",
                                                  "output.progress_bar=false", "output.tensorboard=false"], None)


@pytest.mark.slow
def test_alpaca_and_sharegpt_halves_mixed_with_weights_train_the_demo(tmp_path):
    """The demo's chat data as an alpaca half and a sharegpt half (weight 1.5), eval as alpaca: SFT_STEPS steps
    (the demo runs 400) take the held-out loss from 7.6 below SFT_EVAL_LOSS and exact match from 0 to at least
    SFT_EXACT_MATCH."""
    records = reverse_chat("train.jsonl")
    alpaca = write_jsonl(tmp_path / "alpaca.jsonl", [as_alpaca(r) for r in records[:1000]])
    share = write_jsonl(tmp_path / "sharegpt.jsonl", [as_sharegpt(r) for r in records[1000:]])
    held = write_jsonl(tmp_path / "eval.jsonl", [as_alpaca(r) for r in reverse_chat("eval.jsonl")])
    summary = run_demo("sft", tmp_path, f"data.train=[{alpaca}, {share}*1.5]", f"data.eval={held}",
                       f"train.max_steps={SFT_STEPS}")
    assert summary["before"]["exact_match"] <= 0.05
    assert summary["after"]["loss"] <= SFT_EVAL_LOSS, summary
    assert summary["after"]["exact_match"] >= SFT_EXACT_MATCH, summary


@pytest.mark.slow
def test_plain_text_continued_pretraining_with_packing_lowers_eval_loss(tmp_path):
    """The reversal as plain text in a phrasing the base model never saw, packed: TEXT_STEPS steps cut held-out
    loss (the only eval of text) by at least TEXT_LOSS_DROP nats per token."""
    def text(record: dict) -> dict:
        user, answer = record["messages"]
        word = re.search(r"word (\S+) backwards", user["content"]).group(1)
        return {"text": TEXT_PHRASE.format(word=word, answer=answer["content"])}

    train_path = write_jsonl(tmp_path / "text.jsonl", [text(r) for r in reverse_chat("train.jsonl")])
    held = write_jsonl(tmp_path / "text-eval.jsonl", [text(r) for r in reverse_chat("eval.jsonl")])
    summary = run_demo("sft", tmp_path, f"data.train={train_path}", f"data.eval={held}", "data.packing=true",
                       "data.max_length=128", f"train.max_steps={TEXT_STEPS}")
    assert "exact_match" not in summary["after"]
    assert summary["before"]["loss"] - summary["after"]["loss"] >= TEXT_LOSS_DROP, summary


@pytest.mark.slow
def test_dpo_on_trl_implicit_prompt_conversations(tmp_path):
    """The demo's preference pairs as TRL conversational implicit-prompt records (whole chosen and rejected
    conversations): DPO_STEPS steps (the demo runs 150) reach held-out reward accuracy DPO_ACCURACY."""
    def implicit(record: dict) -> dict:
        return {"chosen": [*record["prompt"], {"role": "assistant", "content": record["chosen"]}],
                "rejected": [*record["prompt"], {"role": "assistant", "content": record["rejected"]}]}

    train_path = write_jsonl(tmp_path / "pairs.jsonl", [implicit(r) for r in reverse_chat("prefs-train.jsonl")])
    held = write_jsonl(tmp_path / "pairs-eval.jsonl", [implicit(r) for r in reverse_chat("prefs-eval.jsonl")])
    summary = run_demo("dpo", tmp_path, f"data.train={train_path}", f"data.eval={held}", "eval.generate=false",
                       f"train.max_steps={DPO_STEPS}")
    assert summary["after"]["reward_accuracy"] >= DPO_ACCURACY, summary
    assert summary["after"]["reward_accuracy"] - summary["before"]["reward_accuracy"] >= 0.3, summary
