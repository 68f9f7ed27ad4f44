"""`loraflow generate` and `loraflow chat`: try a trained model.

A run directory (config.yaml + adapter/ or model/) names everything needed: the base model, the adapters merged
into it before training (model.merge_adapters: RL demo runs start from an SFT adapter folded into the base), and
the trained weights. An adapter directory on its own names its base in adapter_config.json; when it sits inside a
run (RUN/adapter, RUN/checkpoints/step-N) that run's config is used, so its merged adapters are not forgotten.
Loading goes through the same functions training uses (setup.model), so the model generated from is the model
that was trained.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from loraflow.errors import ConfigError, DataError, LoraflowError

WHAT_TO_PASS = ("Pass a run directory (with config.yaml and adapter/ or model/), an adapter directory (with "
                "adapter_config.json) or a model directory (with config.json).")


@dataclass
class Loaded:
    model: Any
    tokenizer: Any
    device: str
    source: str
    """What was loaded, in words (printed to stderr)."""
    notes: list[str] = field(default_factory=list)
    adapter: Path | None = None
    """The adapter directory, when an adapter was loaded onto a base."""


@dataclass
class Prompt:
    messages: list[dict[str, str]] | None
    text: str | None
    reference: str | None = None
    """The record's own answer (a trailing assistant message or a `completion` field), shown beside the output."""

    def shown(self) -> str:
        return self.text if self.messages is None else self.messages[-1]["content"]


def _run_config(directory: Path):
    """The config.yaml of the run that holds `directory` (RUN, RUN/adapter, RUN/checkpoints/step-N), or None."""
    from loraflow.config import load_config

    for candidate in (directory, directory.parent, directory.parent.parent):
        if (candidate / "config.yaml").is_file():
            return load_config(candidate / "config.yaml"), candidate
    return None, None


def _weights_of_run(run: Path) -> Path:
    for name, marker in (("adapter", "adapter_config.json"), ("model", "config.json")):
        if (run / name / marker).is_file():
            return run / name
    steps = sorted((run / "checkpoints").glob("step-*")) if (run / "checkpoints").is_dir() else []
    hint = f" Its latest checkpoint is {steps[-1]}: pass that directory." if steps else ""
    raise LoraflowError(f"{run} is a run directory without final weights (no adapter/ or model/): the run has not "
                        f"finished.{hint}")


def load(target: str, base: str | None = None) -> Loaded:
    """The model and tokenizer of a run, adapter or model directory, in eval mode on the GPU when there is one."""
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from loraflow.locations import location_of
    from loraflow.setup.model import load_model, load_tokenizer, merge_adapters
    from loraflow.stagespec import STAGES, stage_spec

    path = Path(target).expanduser()
    if not path.is_dir():
        raise LoraflowError(f"{target}: no such directory. {WHAT_TO_PASS}")
    config, run = _run_config(path)
    if config is not None and stage_spec(config.stage).head == "score":
        generating = ", ".join(n for n, s in STAGES.items() if s.head != "score")
        raise LoraflowError(f"{run} is a reward-model run (stage {config.stage}): it scores text, it does not "
                            f"generate. Pass a run of a stage that trains a language model ({generating}).")
    weights = _weights_of_run(path) if (path / "config.yaml").is_file() else path
    is_adapter = (weights / "adapter_config.json").is_file()
    if not is_adapter and not (weights / "config.json").is_file():
        raise LoraflowError(f"{target} is neither a run, an adapter nor a model directory. {WHAT_TO_PASS}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    notes: list[str] = []
    if is_adapter:
        peft_config = PeftConfig.from_pretrained(str(weights))
        if str(peft_config.task_type) in ("SEQ_CLS", "TaskType.SEQ_CLS"):
            raise LoraflowError(f"{weights} is a reward-model adapter (task_type SEQ_CLS): it scores text, it does "
                                "not generate.")
        if base is not None:
            base_path, merged = location_of(base, "--base"), config.model.merge_adapters if config else []
        elif config is not None:
            base_path, merged = location_of(config.model.path, "model.path"), config.model.merge_adapters
        else:
            recorded, where = peft_config.base_model_name_or_path, weights / "adapter_config.json"
            if not recorded:
                raise ConfigError([f"{where} does not record its base model; pass --base."])
            base_path, merged = location_of(recorded, f"{where}: base_model_name_or_path"), []
            notes.append("no run config beside the adapter: if its run merged adapters into the base "
                         "(model.merge_adapters), generate from the run directory instead")
        if config is not None:
            model = _run_base(config, base_path, device)
        else:
            model = AutoModelForCausalLM.from_pretrained(base_path, dtype="auto")
        model = merge_adapters(model, list(merged))
        model = PeftModel.from_pretrained(model, str(weights))
        source = f"adapter {weights} on {base_path}" + "".join(f" + merged {m}" for m in merged)
    else:  # a whole model: full fine-tuning's RUN/model, or the output of `loraflow merge`
        if base is not None:
            raise LoraflowError(f"--base applies to adapters, but {weights} holds a whole model; drop --base.")
        model = AutoModelForCausalLM.from_pretrained(str(weights), dtype="auto")
        base_path, source = str(weights), f"model {weights}"
    if (weights / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(weights))  # saved with the weights by the run
    elif config is not None:
        tokenizer = load_tokenizer(config, base_path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(base_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Loaded(model.to(device).eval(), tokenizer, device, source, notes, weights if is_adapter else None)


def _run_base(config, base_path: str, device: str):
    """The base as the run loaded it. A quantized base is loaded quantized as the run's plan decided (for one
    process), so an adapter trained on 4-bit weights generates from those weights."""
    from loraflow.setup.model import load_model

    if not config.model.quantization.enabled:
        return load_model(config, base_path, "auto")
    import dataclasses

    from loraflow.environment import detect_environment
    from loraflow.plan import resolve

    config = dataclasses.replace(config, model=dataclasses.replace(config.model, path=base_path))
    plan = resolve(config, detect_environment())
    return load_model(config, base_path, plan.load_dtype, attn_implementation=plan.attn_implementation,
                      quantization=plan.quantization, device=device)


def read_prompts(spec: str) -> list[Prompt]:
    """A .txt file (one prompt per non-empty line) or a .jsonl file (`prompt` or `messages` per line)."""
    from loraflow.locations import BUILTIN, location_of

    path = Path(location_of(spec, "--prompts") if spec.startswith(BUILTIN) else spec).expanduser()
    if not path.is_file():
        raise LoraflowError(f"--prompts {spec}: no such file.")
    if path.suffix not in (".txt", ".jsonl"):
        raise LoraflowError(f"--prompts {spec}: give a .txt file (one prompt per line) or a .jsonl file (a `prompt` "
                            "or `messages` field per line).")
    # The data readers' own decoding: bad bytes or bad JSON are named by file, line and offset.
    from loraflow.data.readers import _decode, read_records

    if path.suffix == ".txt":
        raw_lines = path.read_bytes().splitlines(keepends=True)
        starts = [sum(len(r) for r in raw_lines[:i]) for i in range(len(raw_lines))]
        lines = [_decode(path, raw, i + 1, starts[i]).strip() for i, raw in enumerate(raw_lines)]
        prompts = [Prompt(None, line) for line in lines if line]
    else:
        prompts = [_json_prompt(r.data, r.origin) for r in read_records(str(path), "--prompts", "train")]
    if not prompts:
        raise LoraflowError(f"--prompts {spec} holds no prompts (every line is empty).")
    return prompts


def _json_prompt(record: dict, where: str) -> Prompt:
    if isinstance(record.get("messages"), list) and record["messages"]:
        messages = record["messages"]
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                   for m in messages):
            raise DataError(f"{where}: each message needs string `role` and `content`.")
        if messages[-1]["role"] == "assistant":  # an eval record: its answer is the reference, not the prompt
            if len(messages) == 1:
                raise DataError(f"{where}: the only message is the assistant's; there is nothing to answer.")
            return Prompt(messages[:-1], None, messages[-1]["content"])
        return Prompt(messages, None)
    if isinstance(record.get("prompt"), str):
        return Prompt(None, record["prompt"], record.get("completion"))
    raise DataError(f"{where}: no `prompt` (a string) or `messages` (a list of turns); found {sorted(record)}.")


def prompt_ids(loaded: Loaded, prompt: Prompt, chat_template: bool) -> list[int]:
    """Chat messages, or a text as the user's turn, rendered with the tokenizer's chat template (as training
    rendered them); plain text is tokenized as is when there is no template or --no-chat-template."""
    from loraflow.data.formatting import _render

    tok = loaded.tokenizer
    has_template = bool(getattr(tok, "chat_template", None))
    if prompt.messages is not None or (chat_template and has_template):
        if not chat_template:
            raise LoraflowError("--no-chat-template: a `messages` prompt can only be rendered with the chat "
                                "template; give `prompt` text instead, or drop --no-chat-template.")
        messages = prompt.messages or [{"role": "user", "content": prompt.text}]
        return _render(tok, messages, True, "prompt")
    return tok(prompt.text, add_special_tokens=True)["input_ids"]


@dataclass
class Sampling:
    max_new_tokens: int = 64
    temperature: float = 0.0
    """0 is greedy decoding."""
    top_p: float = 1.0
    seed: int = 0

    def check(self) -> None:
        if self.max_new_tokens < 1:
            raise LoraflowError(f"--max-new-tokens {self.max_new_tokens}: must be >= 1.")
        if self.temperature < 0:
            raise LoraflowError(f"--temperature {self.temperature}: must be >= 0 (0 is greedy).")
        if not 0 < self.top_p <= 1:
            raise LoraflowError(f"--top-p {self.top_p}: must be in (0, 1].")


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    """The generated tokens through the first stop token."""


@torch.no_grad()
def complete(loaded: Loaded, ids: list[int], sampling: Sampling) -> Completion:
    """The completion of one prompt. One prompt at a time: no padding, so greedy output is exactly what
    model.generate gives for that prompt alone."""
    from loraflow.rl.rollout import decode, stop_ids

    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    if limit and len(ids) + sampling.max_new_tokens > limit:
        raise LoraflowError(f"the prompt has {len(ids)} tokens; with --max-new-tokens {sampling.max_new_tokens} "
                            f"that exceeds the model's {limit} positions. Shorten the prompt or lower "
                            "--max-new-tokens.")
    tok, stop = loaded.tokenizer, stop_ids(loaded.model, loaded.tokenizer)
    kwargs: dict[str, Any] = {"do_sample": False}
    if sampling.temperature > 0:
        kwargs = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
    input_ids = torch.tensor([ids], device=loaded.device)
    out = loaded.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                max_new_tokens=sampling.max_new_tokens, eos_token_id=stop,
                                pad_token_id=tok.pad_token_id, **kwargs)
    completion = out[:, len(ids):].cpu()
    stopped = torch.isin(completion[0], torch.tensor(stop)).nonzero()
    end = int(stopped[0]) + 1 if len(stopped) else completion.shape[1]
    return Completion(decode(tok, completion, stop)[0], completion[0, :end].tolist())


def generate(loaded: Loaded, prompts: list[Prompt], sampling: Sampling, chat_template: bool = True,
             as_json: bool = False, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    sampling.check()
    for prompt in prompts:
        ids = prompt_ids(loaded, prompt, chat_template)
        # Seeded per prompt: a prompt's sample does not depend on the prompts before it in the file.
        torch.manual_seed(sampling.seed)
        answer = complete(loaded, ids, sampling)
        text = answer.text
        if as_json:
            row: dict[str, Any] = {"messages": prompt.messages} if prompt.messages else {"prompt": prompt.text}
            row.update(completion=text, tokens=len(answer.token_ids))
            if prompt.reference is not None:
                row["reference"] = prompt.reference
            out.write(json.dumps(row) + "\n")
        else:
            ref = f"   (reference: {prompt.reference})" if prompt.reference is not None else ""
            out.write(f">>> {prompt.shown()}\n{text}{ref}\n\n")
        out.flush()


def chat(loaded: Loaded, sampling: Sampling, stdin: TextIO | None = None, out: TextIO | None = None) -> None:
    """One conversation: each line is a user turn; `/reset` starts over, `/exit` or end of input stops."""
    stdin, out = stdin or sys.stdin, out or sys.stdout
    sampling.check()
    if not getattr(loaded.tokenizer, "chat_template", None):
        raise LoraflowError("chat needs a tokenizer with a chat template, and this model's has none; use "
                            "`loraflow generate --no-chat-template` for plain-text prompts.")
    torch.manual_seed(sampling.seed)  # once: the whole conversation replays with the same seed
    interactive = stdin.isatty()
    if interactive:
        out.write(f"chatting with {loaded.source}; /reset starts over, /exit quits\n")
    messages: list[dict[str, str]] = []
    while True:
        if interactive:
            out.write("you> ")
            out.flush()
        line = stdin.readline()
        if not line:
            break  # end of input
        text = line.strip()
        if not text:
            continue
        if text == "/exit":
            break
        if text == "/reset":
            messages = []
            out.write("(conversation reset)\n")
            continue
        messages.append({"role": "user", "content": text})
        ids = prompt_ids(loaded, Prompt(messages, None), True)
        limit = getattr(loaded.model.config, "max_position_embeddings", None)
        # The oldest exchanges go first when the conversation outgrows the model's positions.
        while limit and len(ids) + sampling.max_new_tokens > limit and len(messages) > 2:
            messages = messages[2:]
            ids = prompt_ids(loaded, Prompt(messages, None), True)
            out.write("(dropped the oldest exchange: the conversation outgrew the model's context)\n")
        reply = complete(loaded, ids, sampling).text
        messages.append({"role": "assistant", "content": reply})
        out.write(f"assistant> {reply}\n")
        out.flush()
