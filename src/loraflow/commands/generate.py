"""`loraflow generate` and `loraflow chat`: try a trained model.

A run directory (config.yaml + adapter/ or model/) names everything needed: the base model, the adapters merged
into it before training (model.merge_adapters: RL demo runs start from an SFT adapter folded into the base), and
the trained weights. An adapter directory on its own names its base in adapter_config.json; when it sits inside a
run (RUN/adapter, RUN/checkpoints/step-N) that run's config is used, so its merged adapters are not forgotten.
Loading goes through the same functions training uses (setup.model), so the model generated from is the model
that was trained. An image-text model is loaded with its processor, and prompts may carry images (commands/vision.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import torch

from loraflow.commands.prompt import Prompt
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
    processor: Any = None
    """An image-text model's processor (its tokenizer is `tokenizer`); None for a text model."""


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
    from transformers import AutoTokenizer

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
            model = _pretrained(base_path)
        model = merge_adapters(model, list(merged))
        model = PeftModel.from_pretrained(model, str(weights))
        source = f"adapter {weights} on {base_path}" + "".join(f" + merged {m}" for m in merged)
    else:  # a whole model: full fine-tuning's RUN/model, or the output of `loraflow merge`
        if base is not None:
            raise LoraflowError(f"--base applies to adapters, but {weights} holds a whole model; drop --base.")
        model = _pretrained(str(weights))
        base_path, source = str(weights), f"model {weights}"
    from loraflow.commands.vision import load_processor_for

    processor = load_processor_for(model, weights, config, base_path)
    if processor is not None:
        tokenizer = processor.tokenizer  # its pad token set as training sets it (setup.processor)
    elif (weights / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(weights))  # saved with the weights by the run
    elif config is not None:
        tokenizer = load_tokenizer(config, base_path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(base_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return Loaded(model.to(device).eval(), tokenizer, device, source, notes, weights if is_adapter else None,
                  processor)


def _pretrained(path: str):
    """A saved model with the auto class training would load it with: image-text models have no causal-LM class."""
    from transformers import AutoConfig

    from loraflow.setup.preflight import model_auto_class

    return model_auto_class(AutoConfig.from_pretrained(path)).from_pretrained(path, dtype="auto")


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
    """A .txt file (one prompt per non-empty line) or a .jsonl file (`prompt` or `messages` per line; messages may
    hold image parts, as image-text training data does)."""
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
        prompts = [_json_prompt(r) for r in read_records(str(path), "--prompts", "train")]
    if not prompts:
        raise LoraflowError(f"--prompts {spec} holds no prompts (every line is empty).")
    return prompts


def _json_prompt(raw) -> Prompt:
    record, where = raw.data, raw.origin
    if isinstance(record.get("messages"), list) and record["messages"]:
        messages = record["messages"]
        if any(isinstance(m, dict) and isinstance(m.get("content"), list) for m in messages):
            from loraflow.commands.vision import file_prompt

            return file_prompt(messages, raw)  # content parts, images among them: the training data's reader
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                   for m in messages):
            raise DataError(f"{where}: each message needs a string `role`, and `content` a string or a list of "
                            "parts ({\"type\": \"text\", \"text\": ...} or {\"type\": \"image\", \"path\": ...}).")
        if messages[-1]["role"] == "assistant":  # an eval record: its answer is the reference, not the prompt
            if len(messages) == 1:
                raise DataError(f"{where}: the only message is the assistant's; there is nothing to answer.")
            return Prompt(messages[:-1], None, messages[-1]["content"], f"--prompts {where}")
        return Prompt(messages, None, origin=f"--prompts {where}")
    if isinstance(record.get("prompt"), str):
        return Prompt(None, record["prompt"], record.get("completion"), f"--prompts {where}")
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


def prompt_inputs(loaded: Loaded, prompt: Prompt, chat_template: bool) -> tuple[list[int], dict[str, torch.Tensor]]:
    """The prompt's ids and, for an image-text model, the processor's other inputs for generate() (pixel values,
    image sizes, per-token types). An image-text model renders chat with its processor, as training did; plain
    text without a template, or with --no-chat-template, is tokenized as for a text model."""
    processor = loaded.processor
    templated = chat_template and (prompt.messages is not None or bool(getattr(processor, "chat_template", None)))
    if processor is None or not templated:
        if prompt.chat is not None and prompt.chat.images and not chat_template:
            raise LoraflowError(f"--no-chat-template: {prompt.origin} gives images, and only the chat template "
                                "places them in the prompt; drop --no-chat-template.")
        return prompt_ids(loaded, prompt, chat_template), {}
    from loraflow.commands.vision import processor_inputs

    inputs = processor_inputs(loaded, prompt)
    ids = inputs.pop("input_ids")[0].tolist()
    inputs.pop("attention_mask", None)  # one prompt, no padding: complete() passes all ones
    return ids, inputs


def positions(model) -> int | None:
    """The model's positions (an image-text model keeps them in its text config)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(config, "max_position_embeddings", None)


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
def complete(loaded: Loaded, ids: list[int], sampling: Sampling,
             images: dict[str, torch.Tensor] | None = None) -> Completion:
    """The completion of one prompt (`images`: prompt_inputs' image inputs). One prompt at a time: no padding, so
    greedy output is exactly what model.generate gives for that prompt alone."""
    from loraflow.rl.rollout import decode, stop_ids

    limit = positions(loaded.model)
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
                                pad_token_id=tok.pad_token_id, **kwargs,
                                **{k: v.to(loaded.device) for k, v in (images or {}).items()})
    completion = out[:, len(ids):].cpu()
    stopped = torch.isin(completion[0], torch.tensor(stop)).nonzero()
    end = int(stopped[0]) + 1 if len(stopped) else completion.shape[1]
    return Completion(decode(tok, completion, stop)[0], completion[0, :end].tolist())


def generate(loaded: Loaded, prompts: list[Prompt], sampling: Sampling, chat_template: bool = True,
             as_json: bool = False, out: TextIO | None = None) -> None:
    from loraflow.commands.vision import refuse_images

    out = out or sys.stdout
    sampling.check()
    refuse_images(loaded, prompts)
    for prompt in prompts:
        ids, images = prompt_inputs(loaded, prompt, chat_template)
        # Seeded per prompt: a prompt's sample does not depend on the prompts before it in the file.
        torch.manual_seed(sampling.seed)
        answer = complete(loaded, ids, sampling, images)
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
    """One conversation: each line is a user turn; `/image PATH` attaches an image to the next one (image-text
    models), `/reset` starts over, `/exit` or end of input stops."""
    stdin, out = stdin or sys.stdin, out or sys.stdout
    sampling.check()
    if not getattr(loaded.processor or loaded.tokenizer, "chat_template", None):
        raise LoraflowError("chat needs a tokenizer with a chat template, and this model's has none; use "
                            "`loraflow generate --no-chat-template` for plain-text prompts.")
    torch.manual_seed(sampling.seed)  # once: the whole conversation replays with the same seed
    interactive = stdin.isatty()
    if interactive:
        images = ", /image PATH attaches an image to your next message" if loaded.processor is not None else ""
        out.write(f"chatting with {loaded.source}; /reset starts over, /exit quits{images}\n")
    messages: list[dict[str, Any]] = []
    pending: list[Any] = []  # images attached by /image, waiting for the next user message
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
            messages, pending = [], []
            out.write("(conversation reset)\n")
            continue
        if text == "/image" or text.startswith("/image "):
            _attach(loaded, text[len("/image"):].strip(), pending, interactive, out)
            continue
        if pending:
            from loraflow.commands.vision import user_turn

            messages.append(user_turn(text, pending))
            pending = []
        else:
            messages.append({"role": "user", "content": text})
        ids, images = prompt_inputs(loaded, Prompt(messages, None, origin="chat"), True)
        limit = positions(loaded.model)
        # The oldest exchanges go first when the conversation outgrows the model's positions.
        while limit and len(ids) + sampling.max_new_tokens > limit and len(messages) > 2:
            messages = messages[2:]
            ids, images = prompt_inputs(loaded, Prompt(messages, None, origin="chat"), True)
            out.write("(dropped the oldest exchange: the conversation outgrew the model's context)\n")
        reply = complete(loaded, ids, sampling, images).text
        messages.append({"role": "assistant", "content": reply})
        out.write(f"assistant> {reply}\n")
        out.flush()


def _attach(loaded: Loaded, path: str, pending: list[Any], interactive: bool, out: TextIO) -> None:
    """`/image PATH`: open the image now, so a wrong path is named before the message it was meant for. At a
    terminal the error is shown and the conversation goes on; piped input stops, since the answers that follow
    would silently lack the image."""
    from loraflow.commands.vision import open_flag_image

    try:
        if loaded.processor is None:
            raise LoraflowError(f"/image: {loaded.source} is a text-only model and cannot read images; chat with an "
                                "image-text run to send them.")
        if not path:
            raise LoraflowError("/image needs the image file: /image PATH.")
        pending.append(open_flag_image(path, "/image"))
    except LoraflowError as exc:
        if not interactive:
            raise
        out.write(f"error: {exc}\n")
        return
    out.write(f"(image {path} attached to your next message)\n")
    out.flush()
