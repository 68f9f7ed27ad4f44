"""The rewards area: where each rl.rewards function comes from, and which kind of reward model rl.reward_model is
and how its score is read. rl/rewards.py and rl/reward_model.py do what these words say (docs/rl-rewards.md).

Nothing of the user's is imported or loaded here: `check` runs no user code. How a function is called (TRL's
keywords, or loraflow's fn(completions, fields)) is read from its signature when the run imports it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from loraflow.locations import reward_file, reward_function_location, reward_model_location
from loraflow.plan.context import Context
from loraflow.plan.types import Decision


@dataclass(frozen=True)
class RewardModelPlan:
    kind: str
    """`loraflow` (a `loraflow train rm` output: reads the policy's token ids) or `huggingface` (a
    sequence-classification model with its own tokenizer: reads the completions' text)."""
    location: str
    """A local directory, or a hub id."""


SCORE_READ = {
    "loraflow": "trained by `loraflow train rm` on the policy's tokenizer, it reads the rollout's prompt + completion "
                "token ids as they are; the score is its head's output at the last completion token",
    "huggingface": "a Hugging Face sequence-classification model with its own tokenizer: each completion is decoded "
                   "to text by the policy's tokenizer and re-encoded by the reward model's (a chat prompt and the "
                   "completion as an assistant turn through its chat template, special tokens from the template; a "
                   "plain prompt + the completion as text, with its tokenizer's special tokens); rows are "
                   "right-padded with its pad token (eos when it has none, as TRL does) and the score is the logit "
                   "of its one label (num_labels must be 1) at the last non-pad token, where its forward reads it",
}

CALLED = ("rl.rewards, summed; each function is called as TRL's GRPOTrainer calls it, by keyword (prompts, "
          "completions, completion_ids and each field of the prompt records as a list), or as fn(completions, "
          "fields) when it has a parameter named `fields`: its signature decides when the run imports it")


def decide_rewards(ctx: Context) -> tuple[RewardModelPlan | None, list[Decision]]:
    r = ctx.config.rl
    out = []
    if r.rewards:
        out.append(Decision("rewards", "; ".join(_where(entry) for entry in r.rewards), CALLED))
    if not r.reward_model:
        return None, out
    kind, location = reward_model_location(r.reward_model)
    tokenizer = "" if kind == "loraflow" else f"; {_its_tokenizer(Path(location))}"
    out.append(Decision("reward_model", f"{r.reward_model} ({kind}: {location}{tokenizer})", SCORE_READ[kind]))
    return RewardModelPlan(kind, location), out


def _its_tokenizer(path: Path) -> str:
    """Whether a Hugging Face reward model's own tokenizer has a chat template, from its files (a hub id's are read
    when the run loads it)."""
    if not path.is_dir():
        return "its own tokenizer, read from the hub at load"
    config = path / "tokenizer_config.json"
    saved = json.loads(config.read_text()) if config.is_file() else {}
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file() or "chat_template" in saved:
        return "its own tokenizer, with a chat template"
    return "its own tokenizer, no chat template: chat prompts are refused, plain-text prompts are scored"


def _where(entry: str) -> str:
    form, target, _ = reward_function_location(entry)
    if form == "file":
        path = reward_file(target)
        return f"{entry} from the file {path}" + ("" if path.is_file() else " (no such file: the run stops before "
                                                                              "step one)")
    if form == "module":
        return f"{entry} from the module {target} (the working directory first on sys.path)"
    return f"{entry} (loraflow.rl.rewards)"
