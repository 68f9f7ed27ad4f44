"""Images for `loraflow generate` and `loraflow chat` on image-text runs.

A prompt reaches an image-text model as training data reached it: the messages (transformers' multimodal chat
convention, content a string or a list of `text` and `image` parts) are opened by data.multimodal.prepare_chat, the
processor's chat template renders them and the processor expands each image into its tokens and pixel inputs
(data.multimodal's own _text and _encode), so the model sees the prompt it would have seen in training. Images come
from `--image PATH` beside `--prompt`, from image parts in a `--prompts` JSONL file (relative paths resolve against
that file's directory, as in training data), or from `/image PATH` in chat.

The processor is the one saved with the weights (a run saves it beside its adapter, `loraflow merge` beside the
merged model); a run whose adapter folder lacks it falls back to the processor training loaded (model.tokenizer or
the base).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from loraflow.commands.prompt import Prompt
from loraflow.errors import LoraflowError

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
"""Files that mark a directory as holding a processor (the second is the older, image-processor-only spelling)."""


def load_processor_for(model, weights: Path, config, base_path: str):
    """The processor of an image-text model, None for a text model."""
    from loraflow.setup.preflight import image_text
    from loraflow.setup.processor import load_processor, processor_at

    if not image_text(model.config):
        return None
    trust = bool(config.model.trust_remote_code) if config is not None else False
    if any((weights / name).is_file() for name in PROCESSOR_FILES):
        return processor_at(str(weights), trust)  # saved with the weights: the one the run or merge used
    if config is not None:
        return load_processor(config, base_path)
    if base_path != str(weights):  # an adapter on its own: its base's processor
        return processor_at(base_path, trust)
    raise LoraflowError(f"{weights} holds an image-text model ({model.config.model_type}) but no processor "
                        f"({' or '.join(PROCESSOR_FILES)}), so images cannot be encoded for it. `loraflow merge` "
                        "before this version did not save it: merge again, or copy the base model's processor files "
                        "into that directory.")


def open_flag_image(path: str, flag: str):
    """The RGB image a command-line flag names, by the data readers' decoding (data.images.open_image); errors
    name the flag and the file."""
    from loraflow.data.images import open_image

    try:
        return open_image(path, None)  # relative paths resolve against the working directory
    except FileNotFoundError:
        raise LoraflowError(f"{flag} {path}: no such file ({Path(path).expanduser().absolute()}).") from None
    except Exception as exc:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ValueError for bad files
        raise LoraflowError(f"{flag} {path}: cannot be decoded as an image ({type(exc).__name__}: {exc}). Give a "
                            "PNG, JPEG or WebP file.") from None


def user_turn(text: str, images: list[Any]) -> dict[str, Any]:
    """A user message with `images` (paths or opened images) before its text: the order of the bundled image data
    and of LLaVA's own prompts (`<image>\\nQuestion`)."""
    parts: list[dict[str, Any]] = [{"type": "image", "image": image} for image in images]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def image_prompt(text: str, paths: list[str]):
    """`--prompt TEXT --image PATH...`: one user turn; the images are opened here, before the model loads."""
    from loraflow.data.multimodal import prepare_chat
    from loraflow.data.readers import Record

    opened = [open_flag_image(p, "--image") for p in paths]
    chat = prepare_chat([user_turn(text, opened)], Record({}, "--image"))
    # The shown and --json form names the files; the opened images travel in `chat`.
    messages = [{"role": "user", "content": [*({"type": "image", "path": p} for p in paths),
                                              {"type": "text", "text": text}]}]
    return Prompt(messages, None, origin="--image", chat=chat)


def file_prompt(messages: list[Any], record):
    """A `--prompts` record whose messages hold content parts: validated and its images opened by the training
    data's reader (data.multimodal.prepare_chat), so a bad part or image is named by file, line and part. A trailing
    assistant message is the reference answer."""
    from loraflow.data.images import content_parts
    from loraflow.data.multimodal import prepare_chat
    from loraflow.errors import DataError

    reference = None
    last = messages[-1]
    if isinstance(last, dict) and last.get("role") == "assistant":  # an eval record: its answer is the reference
        if len(messages) == 1:
            raise DataError(f"{record.origin}: the only message is the assistant's; there is nothing to answer.")
        parts = content_parts(last.get("content"), record, f"messages[{len(messages) - 1}].content")
        if any(p["type"] == "image" for p in parts):
            raise DataError(f"{record.origin}: the reference answer (last message) holds an image; answers are text. "
                            "Drop the image from it.")
        reference, messages = "".join(p["text"] for p in parts), messages[:-1]
    chat = prepare_chat(messages, record)
    return Prompt(messages, None, reference, origin=f"--prompts {record.origin}", chat=chat)


def refuse_images(loaded, prompts: list) -> None:
    """Refuse prompts with images for a text-only model before anything is generated, naming where they came from."""
    if loaded.processor is not None:
        return
    for prompt in prompts:
        if prompt.chat is not None and prompt.chat.images:
            fix = ("drop --image" if prompt.origin == "--image" else "drop the image parts from the --prompts file")
            raise LoraflowError(f"{prompt.origin}: the prompt holds {len(prompt.chat.images)} image(s), but "
                                f"{loaded.source} is a text-only model and cannot read images. Generate from an "
                                f"image-text run, or {fix}.")


def processor_inputs(loaded, prompt) -> dict[str, torch.Tensor]:
    """The processor's inputs for one prompt with the generation prompt appended: input_ids, attention_mask and,
    where it has images, their pixel values (and image sizes, token types: whatever the family's processor gives),
    exactly as processor(text=apply_chat_template(...), images=...) returns them."""
    from loraflow.data.multimodal import _encode, _text, prepare_chat
    from loraflow.data.readers import Record

    chat = prompt.chat
    if chat is None:  # text only, or chat's conversation (its images already opened)
        chat = prepare_chat(prompt.messages or [{"role": "user", "content": prompt.text}], Record({}, prompt.origin))
    text = _text(loaded.processor, chat.messages, True, prompt.origin)
    inputs = _encode(loaded.processor, text, chat.images, chat, prompt.origin)
    inputs.pop("labels", None)  # PaliGemma's processor labels its text; generate takes none
    return inputs
