"""Read training records from JSONL, JSON, Parquet or a hub dataset, keeping where each record came from so a
malformed one is reported by file, line (or record number) and field."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraflow.errors import DataError
from loraflow.locations import location_of


@dataclass(frozen=True)
class Record:
    data: dict[str, Any]
    origin: str
    """Where the record came from, e.g. `train.jsonl line 12` or `data.parquet row 3`."""
    base_dir: str | None = None
    """The directory of the data file it was read from: relative image paths in it resolve against this."""


# `PATH line 12`, `PATH record 3`, `PATH row 3`: the origins the file readers below write.
_FILE_ORIGIN = re.compile(r"^(?P<path>.+) (?:line|record|row) \d+$")


def record_dir(record: Record) -> Path | None:
    """The directory of the record's data file: its base_dir, else read from its origin (records rebuilt by format
    conversion keep the origin), None for hub rows."""
    if record.base_dir:
        return Path(record.base_dir)
    match = _FILE_ORIGIN.match(record.origin)
    if match and Path(match["path"]).is_file():
        return Path(match["path"]).resolve().parent
    return None


def _utf8_error(path: Path, exc: UnicodeDecodeError, line: int, line_start: int) -> DataError:
    """Name the file, line, byte offset and the bytes themselves: a raw UnicodeDecodeError names none of them."""
    bad = exc.object[exc.start: exc.end]
    return DataError(f"{path} line {line}: not UTF-8 (bytes {bad!r} at byte offset {line_start + exc.start} of the "
                     f"file). Data files must be UTF-8: re-encode it, e.g. `iconv -f latin1 -t utf-8 {path} > "
                     f"{path.stem}.utf8{path.suffix}` (with -f naming the encoding it was written in).")


def _decode(path: Path, raw: bytes, line: int, line_start: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _utf8_error(path, exc, line, line_start) from None


def _jsonl(path: Path) -> list[Record]:
    records = []
    offset = 0
    with path.open("rb") as fh:  # bytes, so a non-UTF-8 line is reported with its offset rather than a traceback
        for lineno, raw in enumerate(fh, 1):
            start, offset = offset, offset + len(raw)
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark (Windows editors)
                raw, start = raw[3:], 3
            line = _decode(path, raw, lineno, start)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path} line {lineno}: not valid JSON ({exc.msg} at column {exc.colno}). Each line "
                                "must be one JSON object.") from None
            if not isinstance(obj, dict):
                raise DataError(f"{path} line {lineno}: expected a JSON object, got {type(obj).__name__}.")
            records.append(Record(obj, f"{path} line {lineno}", str(path.resolve().parent)))
    return records


def _json(path: Path) -> list[Record]:
    raw = path.read_bytes()
    bom = 3 if raw.startswith(b"\xef\xbb\xbf") else 0  # a UTF-8 byte-order mark (Windows editors)
    try:
        text = raw[bom:].decode("utf-8")
    except UnicodeDecodeError as exc:
        # Positions in the whole file (the decoded bytes start after the mark).
        exc = UnicodeDecodeError("utf-8", raw, exc.start + bom, exc.end + bom, exc.reason)
        line_start = raw.rfind(b"\n", 0, exc.start) + 1
        line = raw.count(b"\n", 0, exc.start) + 1
        exc = UnicodeDecodeError("utf-8", raw[line_start: exc.end], exc.start - line_start, exc.end - line_start,
                                 exc.reason)
        raise _utf8_error(path, exc, line, line_start) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}).") from None
    if isinstance(obj, dict) and isinstance(obj.get("data"), list):
        obj = obj["data"]
    if not isinstance(obj, list):
        raise DataError(f"{path}: expected a JSON list of records (or {{\"data\": [...]}}), got {type(obj).__name__}.")
    out = []
    for i, item in enumerate(obj):
        if not isinstance(item, dict):
            raise DataError(f"{path} record {i}: expected a JSON object, got {type(item).__name__}.")
        out.append(Record(item, f"{path} record {i}", str(path.resolve().parent)))
    return out


def _parquet(path: Path) -> list[Record]:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise DataError(f"{path}: cannot read as Parquet ({exc}).") from None
    return [Record(row, f"{path} row {i}", str(path.resolve().parent)) for i, row in enumerate(rows)]


def _hub(name: str, split: str, key: str) -> list[Record]:
    try:
        import datasets
    except ImportError:
        from loraflow.environment import install_line

        raise DataError(f"{key}={name} is not a local file, and reading hub datasets needs the `datasets` package "
                        f"({install_line('datasets')}).") from None
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as exc:  # network, missing split, unknown dataset
        raise DataError(f"{key}={name} (split {split}): cannot load from the hub ({exc}).") from None
    return [Record(dict(row), f"{name}[{split}] row {i}") for i, row in enumerate(ds)]


READERS = {".jsonl": _jsonl, ".json": _json, ".parquet": _parquet}


def read_records(spec: str, key: str, split: str) -> list[Record]:
    """All records of a data source. `key` is the config key that named it (for error messages)."""
    try:
        resolved = location_of(spec, key)
    except Exception as exc:
        raise DataError(str(exc).split("\n", 1)[-1].strip(" -")) from None
    path = Path(resolved)
    if path.is_file():
        reader = READERS.get(path.suffix.lower())
        if reader is None:
            raise DataError(f"{key}={spec}: unsupported file type `{path.suffix}`; use .jsonl, .json or .parquet.")
        records = reader(path)
    elif path.exists():
        raise DataError(f"{key}={spec} is a directory; name a .jsonl, .json or .parquet file inside it.")
    else:
        records = _hub(resolved, split, key)
    if not records:
        raise DataError(f"{key}={spec} holds no records.")
    return records
