"""Images named by chat records, opened and checked before any model loads.

An image part of a message (transformers' multimodal chat convention) is `{"type": "image", "path": ...}`,
`{"type": "image", "url": ...}` or `{"type": "image", "image": ...}`. Its value is a local path (a relative one
resolves against the directory of the data file the record came from), a `file://` URL, a base64 data URI
(`data:image/png;base64,...`), raw base64, an http(s) URL (fetched with transformers.image_utils.load_image), or,
from a Parquet or hub dataset, a PIL image or a `{"bytes": ..., "path": ...}` cell (the datasets Image feature).

Every image is decoded in full (PIL verify, then load and convert to RGB), so a missing, truncated or undecodable
file is reported by data file, line, part and path rather than as a crash mid-training.
"""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from loraflow.data.readers import Record, record_dir
from loraflow.errors import DataError

IMAGE_KEYS = ("path", "url", "image")
"""The keys an image part may carry its image under, in the order they are looked up."""
DATA_URI = re.compile(r"^data:image/[\w.+-]+;base64,(?P<payload>.*)$", re.DOTALL)
# Raw base64: at least 64 characters of the base64 alphabet only (no dot, so never a file name with an extension).
# An existing file of that name still wins: paths are tried first.
RAW_BASE64 = re.compile(r"^[A-Za-z0-9+/\s]{64,}={0,2}\s*$")


def image_payload(part: dict[str, Any]) -> tuple[str, Any] | None:
    """(key, value) of an image part's image, or None when it carries none."""
    for key in IMAGE_KEYS:
        if part.get(key) is not None:
            return key, part[key]
    return None


def _describe(value: Any) -> str:
    """The image reference as an error names it: a path or URL in full, base64 cut short."""
    if isinstance(value, str):
        if value.startswith("data:") or len(value) > 200:
            return f"{value[:40]}... ({len(value)} characters)"
        return value
    return f"a {type(value).__name__}"


def _decode(data: bytes | Path):
    """PIL image from bytes or a path: verify() checks the file's structure, load() decodes every pixel (a
    truncated PNG passes verify but fails to load)."""
    from PIL import Image

    def opened():
        return Image.open(io.BytesIO(data) if isinstance(data, bytes) else data)

    with opened() as probe:
        probe.verify()  # verify() leaves the image unusable, hence the second open
    with opened() as image:
        image.load()
        return image.convert("RGB")


def _base64(text: str) -> bytes:
    return base64.b64decode("".join(text.split()), validate=True)


def open_image(value: Any, base_dir: Path | None):
    """An RGB PIL image from any accepted reference; raises ValueError/OSError (wrapped by load_image)."""
    from PIL import Image

    if isinstance(value, Image.Image):
        value.load()
        return value.convert("RGB")
    if isinstance(value, dict) and ("bytes" in value or "path" in value):  # datasets' Image feature cell
        if value.get("bytes"):
            return _decode(bytes(value["bytes"]))
        value = value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return _decode(bytes(value))
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"expected a path, URL or base64 string, got {_describe(value)}")
    text = value.strip()
    match = DATA_URI.match(text)
    if match:
        return _decode(_base64(match["payload"]))
    scheme = urlparse(text).scheme.lower()
    if scheme in ("http", "https"):
        from transformers.image_utils import load_image as fetch

        return fetch(text).convert("RGB")
    path = Path(unquote(urlparse(text).path)) if scheme == "file" else Path(text).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if path.is_file():
        return _decode(path)
    if RAW_BASE64.match(text):
        return _decode(_base64(text))
    raise FileNotFoundError(f"no such file: {path}")


def load_image(value: Any, record: Record, where: str):
    """The image an image part names, as RGB; a DataError names the data file and line, the part and the image."""
    base_dir = record_dir(record)
    try:
        return open_image(value, base_dir)
    except FileNotFoundError as exc:
        fix = ("relative paths resolve against the data file's directory" + (f" ({base_dir})" if base_dir else "")
               + "; fix the path or add the file")
        raise DataError(f"{record.origin}: `{where}` names image {_describe(value)}, which cannot be read: {exc}. "
                        f"Fix: {fix}.") from None
    except DataError:
        raise
    except Exception as exc:  # PIL raises UnidentifiedImageError, OSError, SyntaxError, ValueError for bad files
        raise DataError(f"{record.origin}: `{where}` names image {_describe(value)}, which cannot be decoded "
                        f"({type(exc).__name__}: {exc}). Fix: replace it with a valid PNG/JPEG/WebP file or drop "
                        "the part.") from None


def content_parts(content: Any, record: Record, where: str) -> list[dict[str, Any]]:
    """A message's content as a list of parts (a string is one text part); bad parts raise a DataError naming
    `where` (e.g. `messages[0].content`) and the part's index."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise DataError(f"{record.origin}: `{where}` must be a string or a list of parts ({{\"type\": \"text\", "
                        f"\"text\": ...}} or {{\"type\": \"image\", \"path\": ...}}), got {type(content).__name__}.")
    parts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise DataError(f"{record.origin}: `{at}` must be an object with a `type`, got {type(part).__name__}.")
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise DataError(f"{record.origin}: `{at}` is a text part without a string `text`.")
        elif kind in ("image", "image_url"):
            if kind == "image_url":  # OpenAI's spelling: {"type": "image_url", "image_url": {"url": ...}}
                url = part.get("image_url")
                part = {"type": "image", "url": url.get("url") if isinstance(url, dict) else url}
            if image_payload(part) is None:
                raise DataError(f"{record.origin}: `{at}` is an image part without an image: give it one of "
                                f"{', '.join(repr(k) for k in IMAGE_KEYS)} (a path, URL or base64 data).")
        else:
            raise DataError(f"{record.origin}: `{at}` has type {kind!r}; this version reads `text` and `image` parts "
                            "(video and audio are not supported).")
        parts.append(part)
    return parts
