"""rl.reward_model as a Hugging Face sequence-classification model with a tokenizer of its own (a tiny Llama reward
model built from its config, with a character tokenizer whose ids and chat template differ from the policy's): the
scores a GRPO or PPO step trains on are the model's own forward on the completions' text, re-encoded by its tokenizer."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
import torch

from loraflow.config import load_config
from loraflow.data.formatting import IGNORE
from loraflow.environment import detect_environment
from loraflow.errors import ConfigError
from loraflow.locations import ASSETS
from loraflow.plan import resolve
from loraflow.rl.reward_model import load_reward_model
from loraflow.run.config import demo_config
from loraflow.run.pipeline import build_run

CHAT = [{"role": "user", "content": "Please write the word abc backwards."}]
PLAIN = "Reverse the word abc: "


def reward_model_dir(path: Path) -> Path:
    """A one-label LlamaForSequenceClassification and its own tokenizer: characters in another order than the
    policy's, its own special tokens (a BOS it adds to plain text, a pad that is not id 0) and its own chat
    template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    chars = sorted(set(string.printable))[::-1]
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)} | {"[UNK]": len(chars)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["[BOS]", "[EOS]", "[PAD]"])
    bos = tok.token_to_id("[BOS]")
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", bos)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]",
                                        unk_token="[UNK]")
    tokenizer.chat_template = "{% for m in messages %}[BOS]{{ m['role'] }}: {{ m['content'] }}[EOS]{% endfor %}"
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, num_labels=1,
                         pad_token_id=tokenizer.pad_token_id)
    LlamaForSequenceClassification(config).save_pretrained(path)
    return path


# GRPO keeps the summed rewards in the step's batch, PPO the reward model's scores (before its KL penalty).
@pytest.mark.parametrize("stage,key", [("grpo", "rewards"), ("ppo", "scores")])
def test_a_hugging_face_reward_model_scores_rollouts_as_its_own_forward(stage, key, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    rm = reward_model_dir(tmp_path / "rm")
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"prompt": CHAT}) + "\n" + json.dumps({"prompt": PLAIN}) + "\n")
    config = load_config(str(demo_config(stage)), [
        f"stage={stage}", "rl.rewards=[]", "rl.eval_rewards=[]", f"rl.reward_model={rm}", f"data.train={data}", "data.eval=",
        "rl.group_size=2", "rl.max_new_tokens=6", "train.micro_batch_size=2", "output.progress_bar=false",
        "output.tensorboard=false", f"output.dir={tmp_path / 'run'}"])
    run = build_run(config, detect_environment(), tmp_path / "run")
    decision = next(d for d in run.trainer.plan.decisions if d.key == "reward_model")
    assert "huggingface" in decision.value and "its own tokenizer, with a chat template" in decision.value
    assert "re-encoded by the reward model's" in decision.reason
    for _ in range(2):  # two steps: the scores of each are the reward model's
        run.trainer.accumulate()
        run.trainer.apply_update()
        batch = run.trainer.prepared[0][0][0]
        policy = run.trainer.tokenizer
        model = AutoModelForSequenceClassification.from_pretrained(rm).eval()
        own = AutoTokenizer.from_pretrained(rm)
        expected = []
        for ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist()):
            completion = [t for t, label in zip(ids, labels) if label != IGNORE]
            if "Please write" in policy.decode(ids, skip_special_tokens=True):  # the chat prompt: its template
                turn = [*CHAT, {"role": "assistant", "content": policy.decode(completion, skip_special_tokens=True)
                        .strip()}]
                rm_ids = own(own.apply_chat_template(turn, tokenize=False), add_special_tokens=False)["input_ids"]
            else:  # plain text: prompt + completion, with the reward model's own BOS
                rm_ids = own(PLAIN + policy.decode(completion, skip_special_tokens=True))["input_ids"]
            assert rm_ids[0] == own.bos_token_id and rm_ids != policy(own.decode(rm_ids))["input_ids"]
            with torch.no_grad():
                expected.append(float(model(input_ids=torch.tensor([rm_ids])).logits[0, 0]))
        assert batch[key].tolist() == pytest.approx(expected, abs=1e-5)
        assert len(set(expected)) > 1  # the rows really differ


def test_reward_models_that_cannot_give_one_score_are_refused(tmp_path):
    from transformers import LlamaConfig

    def load(spec: str, chat_prompts: bool = False):
        config = load_config(str(demo_config("grpo")), ["stage=grpo", f"rl.reward_model={spec}"])
        return load_reward_model(resolve(config, detect_environment()), None, chat_prompts)

    two = tmp_path / "two-labels"
    LlamaConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_labels=2,
                architectures=["LlamaForSequenceClassification"]).save_pretrained(two)
    with pytest.raises(ConfigError, match=r"classifier with 2 labels \(0=LABEL_0, 1=LABEL_1\).*rl.rewards"):
        load(str(two))
    with pytest.raises(ConfigError, match="is a LlamaForCausalLM, not a sequence-classification model"):
        load(str(ASSETS / "tiny-base"))
    untemplated = reward_model_dir(tmp_path / "no-template")
    (untemplated / "chat_template.jinja").unlink()
    assert load(str(untemplated)).chat_template is None  # plain-text prompts: scored
    with pytest.raises(ConfigError, match="prompts are chat messages but the reward model's tokenizer has no chat"):
        load(str(untemplated), chat_prompts=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="neither reward_model.json .* nor config.json"):
        load(str(tmp_path / "empty"))
    # `check` names the kind before anything loads: the shipped `loraflow train rm` output reads the policy's ids.
    plan = resolve(load_config(str(demo_config("ppo")), ["stage=ppo"]), detect_environment())
    decision = next(d for d in plan.decisions if d.key == "reward_model")
    assert "loraflow" in decision.value and "policy's tokenizer" in decision.reason
    assert plan.reward_model.kind == "loraflow"


def test_rows_longer_than_the_reward_model_reads_keep_their_end(tmp_path, caplog):
    """A reward model with a stated limit (model_max_length 12 here; DeBERTa's 512, GPT-2's 1024 in the wild) is
    given at most that many tokens: the last ones, which its head scores, with one warning naming the keys."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    rm = reward_model_dir(tmp_path / "rm")
    own = AutoTokenizer.from_pretrained(rm)
    own.model_max_length = 12
    own.save_pretrained(rm)
    plan = resolve(load_config(str(demo_config("grpo")), ["stage=grpo", f"rl.reward_model={rm}"]),
                   detect_environment())
    policy = AutoTokenizer.from_pretrained(ASSETS / "tiny-base")
    scorer = load_reward_model(plan, policy)
    assert scorer.limit == 12
    text = " cba, and that is all."
    sampled = SimpleNamespace(prompts=[PLAIN, "ab"], completion_ids=[policy(text)["input_ids"], policy("c")[
        "input_ids"]], texts=[text, "c"])
    with caplog.at_level("WARNING", logger="loraflow"):
        batch = scorer.batch(sampled)
    whole = scorer.encode(PLAIN, sampled.completion_ids[0], text)
    assert len(whole) > 12 and batch["input_ids"][0].tolist() == whole[-12:]
    assert batch["attention_mask"][1].sum() == len(scorer.encode("ab", sampled.completion_ids[1], "c"))
    assert scorer.cut == 1 and "rl.reward_model" in caplog.text
    assert "data.max_length or rl.max_new_tokens" in caplog.text
    assert torch.isfinite(scorer.score(sampled)).all()
