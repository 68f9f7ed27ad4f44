"""The data formats people bring, each converted to one of the canonical records the tokenizers read.

Canonical SFT records: {"messages": [...]}, {"prompt": str, "completion": str}, {"text": str}.
Canonical pair records: {"prompt": str or chat messages, "chosen": ..., "rejected": ...}, each answer a string or a
list of messages that continue the prompt. The TRL preference formats follow
https://huggingface.co/docs/trl/dataset_formats#preference (explicit and implicit prompt, standard and
conversational); the implicit prompt is split off as trl.data_utils.extract_prompt does.

A file's format is detected from its first record's keys (data.format forces one) and every record of the file is
then read in that format, so a record lacking a key is reported by file and line rather than silently read another
way. `data.columns` renames keys before detection.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from loraflow.data.readers import Record
from loraflow.errors import DataError
from loraflow.stagespec import STAGES

# ShareGPT speaker names (FastChat, LLaMA-Factory, axolotl) -> chat roles. `function_call` is the model calling a
# tool, so it is an assistant turn (learned); `observation` is the tool's answer.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system",
                  "tool": "tool", "function_call": "assistant", "observation": "tool"}


@dataclass(frozen=True)
class Format:
    name: str
    kind: str
    """"sft" or "pairs": which loader reads it."""
    needs: str
    """The keys it needs, for refusals."""
    shows: str
    """The keys, for the log line `read as alpaca (instruction/input/output)`."""
    detect: Callable[[dict[str, Any]], bool]
    convert: Callable[[dict[str, Any], str, bool], dict[str, Any]]
    """(record data, origin, tokenizer has a chat template) -> canonical data; raises DataError naming origin."""


def _string(data: dict[str, Any], key: str, origin: str, fmt: str, optional: bool = False) -> str:
    value = data.get(key)
    if value is None and optional:
        return ""
    if not isinstance(value, str) or (not optional and not value.strip()):
        got = "missing" if key not in data else "empty" if isinstance(value, str) else f"a {type(value).__name__}"
        raise DataError(f"{origin}: field `{key}` must be a non-empty string ({fmt} format), got {got}.")
    return value


def _alpaca(data: dict[str, Any], origin: str, chat: bool) -> dict[str, Any]:
    instruction = _string(data, "instruction", origin, "alpaca")
    extra = _string(data, "input", origin, "alpaca", optional=True)
    output = _string(data, "output", origin, "alpaca")
    system = _string(data, "system", origin, "alpaca", optional=True)
    user = f"{instruction}\n{extra}" if extra.strip() else instruction
    if not chat:  # no chat template to render turns with: the user turn is the prompt, the answer the completion
        return {"prompt": f"{system}\n\n{user}" if system.strip() else user, "completion": output}
    messages = [{"role": "system", "content": system}] if system.strip() else []
    return {"messages": [*messages, {"role": "user", "content": user}, {"role": "assistant", "content": output}]}


def _sharegpt(data: dict[str, Any], origin: str, chat: bool) -> dict[str, Any]:
    key = "conversations" if "conversations" in data else "conversation"
    turns = data.get(key)
    if not isinstance(turns, list) or not turns:
        raise DataError(f"{origin}: field `{key}` must be a non-empty list of {{from, value}} turns (sharegpt format).")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise DataError(f"{origin}: field `{key}[{i}]` must be an object with `from` and `value`.")
        # Some exports keep the ShareGPT list but write OpenAI's role/content inside it.
        speaker, text = (turn.get("from"), turn.get("value")) if "from" in turn else (turn.get("role"),
                                                                                      turn.get("content"))
        if not isinstance(speaker, str) or speaker not in SHAREGPT_ROLES:
            raise DataError(f"{origin}: field `{key}[{i}].from` must be one of {', '.join(SHAREGPT_ROLES)}; got "
                            f"{speaker!r}.")
        if not isinstance(text, str):
            raise DataError(f"{origin}: field `{key}[{i}].value` must be a string.")
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": text})
    return {"messages": messages}


def _keep(*keys: str) -> Callable[[dict[str, Any], str, bool], dict[str, Any]]:
    def convert(data: dict[str, Any], origin: str, chat: bool) -> dict[str, Any]:
        missing = [k for k in keys if k not in data]
        if missing:
            raise DataError(f"{origin}: missing field `{missing[0]}`. Fields present: "
                            f"{', '.join(sorted(data)) or 'none'}.")
        return data

    return convert


def _text(data: dict[str, Any], origin: str, chat: bool) -> dict[str, Any]:
    return {"text": _string(data, "text", origin, "text")}


def _explicit(data: dict[str, Any], origin: str, chat: bool) -> dict[str, Any]:
    if "prompt" not in data and "messages" in data:  # the older spelling of a chat prompt
        data = {**data, "prompt": data["messages"]}
    return _keep("prompt", "chosen", "rejected")(data, origin, chat)


def _shared_prefix(chosen: Any, rejected: Any) -> int:
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    # As trl.data_utils.extract_prompt: a space just before the answers diverge belongs to the answers.
    if isinstance(chosen, str) and 0 < n < min(len(chosen), len(rejected)) and chosen[n - 1] == " ":
        n -= 1
    return n


def _implicit(data: dict[str, Any], origin: str, chat: bool) -> dict[str, Any]:
    chosen, rejected = data.get("chosen"), data.get("rejected")
    both_text = isinstance(chosen, str) and isinstance(rejected, str)
    both_chat = isinstance(chosen, list) and isinstance(rejected, list)
    if not (both_text or both_chat):
        raise DataError(f"{origin}: fields `chosen` and `rejected` must both be strings or both be lists of chat "
                        "messages (preference_implicit format).")
    n = _shared_prefix(chosen, rejected)
    if n == 0:
        raise DataError(f"{origin}: `chosen` and `rejected` share no leading {'messages' if both_chat else 'text'}, "
                        "so there is no implicit prompt to split off. Add a `prompt` field (explicit prompt).")
    if both_chat and isinstance(chosen[n - 1], dict) and chosen[n - 1].get("role") == "assistant":
        raise DataError(f"{origin}: `chosen` and `rejected` part ways after an assistant turn; the shared leading "
                        "messages must end with the user's turn so that the answers are what differs.")
    rest = {k: v for k, v in data.items() if k not in ("chosen", "rejected")}
    return {**rest, "prompt": chosen[:n], "chosen": chosen[n:], "rejected": rejected[n:]}


FORMATS: tuple[Format, ...] = (
    Format("messages", "sft", "messages (a list of {role, content})", "messages",
           lambda d: "messages" in d, _keep("messages")),
    Format("sharegpt", "sft", "conversations or conversation (a list of {from, value})", "conversations",
           lambda d: "conversations" in d or "conversation" in d, _sharegpt),
    Format("alpaca", "sft", "instruction, output (optional: input, system)", "instruction/input/output",
           lambda d: "instruction" in d and "output" in d, _alpaca),
    Format("prompt_completion", "sft", "prompt, completion", "prompt/completion",
           lambda d: "prompt" in d or "completion" in d, _keep("prompt", "completion")),
    Format("text", "sft", "text (continued pretraining: every token is learned)", "text",
           lambda d: "text" in d, _text),
    Format("preference", "pairs", "prompt, chosen, rejected (prompt a string or chat messages; answers strings "
           "or assistant-turn lists)", "prompt/chosen/rejected",
           lambda d: ("prompt" in d or "messages" in d) and "chosen" in d and "rejected" in d, _explicit),
    Format("preference_implicit", "pairs", "chosen, rejected (whole conversations or texts sharing the prompt; no "
           "prompt field)", "chosen/rejected, shared prompt",
           lambda d: "chosen" in d and "rejected" in d and "prompt" not in d and "messages" not in d, _implicit),
)
BY_NAME = {f.name: f for f in FORMATS}
# Each data kind in words, with the stages that read it (stagespec.py): "preference-pair (rm, dpo)".
KIND_NAMES = {kind: f"{words} ({', '.join(s.name for s in STAGES.values() if s.data == kind)})"
              for kind, words in (("sft", "supervised"), ("pairs", "preference-pair"))}

# Key names seen in public datasets, used only to propose a data.columns mapping (which is verified before it is
# proposed).
PROMPT_LIKE = ("prompt", "question", "query", "instruction", "input", "problem", "source", "context", "request")
ANSWER_LIKE = ("completion", "answer", "response", "output", "solution", "target", "reply", "label")
CHOSEN_LIKE = ("chosen", "preferred", "accepted", "better", "good", "positive", "winner", "response_j")
REJECTED_LIKE = ("rejected", "dispreferred", "worse", "bad", "negative", "loser", "response_k")


def parse_columns(items: list[str]) -> list[tuple[str, str]]:
    """data.columns entries `SOURCE=TARGET` -> pairs, refused with the entry named."""
    out = []
    for i, item in enumerate(items):
        source, sep, target = item.partition("=")
        if not sep or not source.strip() or not target.strip():
            raise DataError(f"data.columns[{i}]={item!r} must be SOURCE=TARGET, e.g. data.columns=[question=prompt,"
                            "answer=completion].")
        out.append((source.strip(), target.strip()))
    return out


def apply_columns(data: dict[str, Any], columns: list[tuple[str, str]], origin: str) -> dict[str, Any]:
    """Rename the keys a mapping names (a key a record lacks is left alone: mixed files may differ)."""
    if not columns or not any(s in data for s, _ in columns):
        return data
    out = dict(data)
    for source, target in columns:
        if source not in data:
            continue
        if target in data and target not in {s for s, _ in columns}:
            raise DataError(f"{origin}: data.columns maps `{source}` to `{target}`, but the record already has "
                            f"`{target}`. Map `{target}` elsewhere too, or drop this mapping.")
        out.pop(source, None)
    for source, target in columns:
        if source in data:
            out[target] = data[source]
    return out


def detect(data: dict[str, Any], kind: str) -> Format | None:
    return next((f for f in FORMATS if f.kind == kind and f.detect(data)), None)


def _works(data: dict[str, Any], kind: str, chat: bool, fmt: Format | None = None) -> bool:
    fmt = fmt or detect(data, kind)
    if fmt is None or not fmt.detect(data):
        return False
    try:
        fmt.convert(data, "", chat)
    except DataError:
        return False
    return True


def _mapping_candidates(data: dict[str, Any], kind: str) -> list[list[tuple[str, str]]]:
    lower = {k.lower(): k for k in data}
    strings = [k for k, v in data.items() if isinstance(v, str)]

    def first(names: tuple[str, ...], exclude: set[str]) -> str | None:
        return next((lower[n] for n in names if n in lower and lower[n] not in exclude), None)

    out: list[list[tuple[str, str]]] = []
    if kind == "pairs":
        good = first(CHOSEN_LIKE, set())
        bad = first(REJECTED_LIKE, {good} if good else set())
        prompt = first(PROMPT_LIKE, {good, bad})
        if good and bad:
            out.append([(prompt, "prompt"), (good, "chosen"), (bad, "rejected")] if prompt else
                       [(good, "chosen"), (bad, "rejected")])
        return out
    prompt = first(PROMPT_LIKE, set())
    answer = first(ANSWER_LIKE, {prompt} if prompt else set())
    if prompt and answer:
        out.append([(prompt, "prompt"), (answer, "completion")])
    if len(strings) == 2:
        out.append([(strings[0], "prompt"), (strings[1], "completion")])
    if len(strings) == 1:
        out.append([(strings[0], "text")])
    for k, v in data.items():  # a list of chat turns under another name
        if isinstance(v, list) and v and isinstance(v[0], dict):
            out.append([(k, "messages" if "role" in v[0] else "conversations")])
    return out


def suggestion(data: dict[str, Any], kind: str, chat: bool, forced: str) -> str:
    """A data.format value or data.columns mapping that reads this record, checked by reading it; else a hint."""
    if forced != "auto":
        found = detect(data, kind)
        if found is not None and _works(data, kind, chat, found):
            return f"This record reads as {found.name}: set data.format={found.name} (or auto)."
    for mapping in _mapping_candidates(data, kind):
        mapping = [(s, t) for s, t in mapping if s != t]
        try:
            mapped = apply_columns(data, mapping, "")
        except DataError:
            continue
        if mapping and _works(mapped, kind, chat, None if forced == "auto" else BY_NAME[forced]):
            value = ",".join(f"{s}={t}" for s, t in mapping)
            return f"Its keys map onto a format: set data.columns=[{value}]."
    return "Rename its keys to one of these, or map them with data.columns=[YOUR_KEY=TARGET_KEY,...]."


def refusal(record: Record, kind: str, chat: bool, forced: str) -> DataError:
    keys = ", ".join(sorted(record.data)) or "none"
    table = "; ".join(f"{f.name}: {f.needs}" for f in FORMATS if f.kind == kind)
    if forced != "auto":
        head = f"{record.origin}: data.format={forced} needs {BY_NAME[forced].needs}; this record has keys: {keys}."
    else:
        head = f"{record.origin}: this record matches no {KIND_NAMES[kind]} data format (its keys: {keys})."
    return DataError(f"{head} Formats and the keys each needs: {table}. "
                     f"{suggestion(record.data, kind, chat, forced)}")


def choose(record: Record, kind: str, chat: bool, forced: str) -> Format:
    """The format of a file, from its first record (or data.format)."""
    if forced != "auto":
        fmt = BY_NAME[forced]
        if fmt.kind != kind:
            names = ", ".join(f.name for f in FORMATS if f.kind == kind)
            raise DataError(f"data.format={forced} is a {KIND_NAMES[fmt.kind]} format, and this stage reads "
                            f"{KIND_NAMES[kind]} data: set data.format to auto or one of {names}.")
        if not fmt.detect(record.data):
            raise refusal(record, kind, chat, forced)
        return fmt
    fmt = detect(record.data, kind)
    if fmt is None:
        raise refusal(record, kind, chat, forced)
    return fmt


def to_canonical(record: Record, fmt: Format, chat: bool) -> Record:
    return Record(fmt.convert(record.data, record.origin, chat), record.origin)
