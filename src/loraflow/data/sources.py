"""Where a split's records come from: one or several sources with mixing weights, keys renamed by data.columns,
each file's format detected (and logged) from its first record, and optionally a held-out fraction of data.train
as the eval set. Records keep their own origin (file + line) through all of it."""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass

from loraflow.data.formats import apply_columns, choose, parse_columns, to_canonical
from loraflow.data.readers import Record, read_records
from loraflow.errors import DataError

log = logging.getLogger("loraflow")

# `PATH*WEIGHT`: a trailing `*` and a number. A `:` suffix would clash with `builtin:` specs, hub names and
# Windows drives; a literal `*` at the end of a data file's name is not something people write.
WEIGHTED = re.compile(r"^(?P<spec>.+?)\s*\*\s*(?P<weight>\d+(?:\.\d*)?|\.\d+)$")


@dataclass(frozen=True)
class Source:
    spec: str
    weight: float
    key: str


def parse_sources(value: str | list[str] | None, key: str) -> list[Source]:
    """data.train as one spec or a list, each optionally `PATH*WEIGHT`."""
    items = value if isinstance(value, list) else [value] if value else []
    out = []
    for i, item in enumerate(items):
        where = f"{key}[{i}]" if isinstance(value, list) else key
        match = WEIGHTED.match(item.strip())
        spec, weight = (match["spec"], float(match["weight"])) if match else (item.strip(), 1.0)
        if weight <= 0:
            raise DataError(f"{where}={item!r}: a mixing weight must be above 0 (drop the source to leave it out).")
        out.append(Source(spec, weight, where))
    return out


def has_eval_set(data) -> bool:
    """Whether a run evaluates: data.eval names a set, or data.eval_split holds a fraction of data.train out."""
    if data.eval:
        return True
    try:
        return held_out_fraction(data.eval_split) is not None
    except DataError:  # reported when the data loads, with the fix
        return False


def held_out_fraction(eval_split: str) -> float | None:
    """data.eval_split as a fraction of data.train to hold out, or None when it names a hub split."""
    try:
        fraction = float(eval_split)
    except ValueError:
        return None
    if not 0 < fraction < 1:
        raise DataError(f"data.eval_split={eval_split}: a held-out fraction must be between 0 and 1 (e.g. 0.05); a "
                        "hub split is named by text such as `test`.")
    return fraction


def _read(source: Source, split: str, kind: str, chat: bool, forced: str, columns: list[tuple[str, str]],
          seen: set[str]) -> list[Record]:
    raw = read_records(source.spec, source.key, split)
    for r in raw:
        seen.update(r.data)
    records = [Record(apply_columns(r.data, columns, r.origin), r.origin) for r in raw]
    if kind == "prompts":  # grpo/ppo prompts: any other fields go to the reward functions as they are
        return records
    fmt = choose(records[0], kind, chat, forced)
    log.info("%s: %s read as %s%s", source.key, source.spec, fmt.name,
             f" ({fmt.shows})" if fmt.shows != fmt.name else "")
    return [to_canonical(r, fmt, chat) for r in records]


def _weighted(records: list[Record], weight: float, rng: random.Random) -> list[Record]:
    """A weight of 2.5 repeats every record twice and adds a seeded half of them once more; 0.3 keeps 30%."""
    if not records:
        return []
    count = max(1, round(weight * len(records)))
    full, rest = divmod(count, len(records))
    extra = sorted(rng.sample(range(len(records)), rest))
    return records * full + [records[i] for i in extra]


def _mix(sources: list[Source], per_source: list[list[Record]], seed: int, key: str) -> list[Record]:
    if len(sources) == 1 and sources[0].weight == 1:
        return per_source[0]
    out, parts = [], []
    for i, (source, records) in enumerate(zip(sources, per_source)):
        # One generator per source, seeded by train.seed and the source's place, so adding a source does not
        # reshuffle the others' samples.
        mixed = _weighted(records, source.weight, random.Random(seed * 1_000_003 + i))
        parts.append(f"{source.spec} {len(records)} x {source.weight:g} = {len(mixed)}")
        out += mixed
    log.info("%s: mixed %d sources (seed train.seed=%d): %s; %d records in all", key, len(sources), seed,
             ", ".join(parts), len(out))
    return out


def read_splits(config, kind: str, chat: bool) -> tuple[list[Record], list[Record] | None]:
    """(train records, eval records or None), canonical for `kind` ("sft", "pairs" or "prompts")."""
    d, seed = config.data, config.train.seed
    columns = parse_columns(d.columns)
    fraction = held_out_fraction(d.eval_split)
    if fraction is not None and d.eval:
        raise DataError(f"data.eval_split={d.eval_split} holds out part of data.train as the eval set, but data.eval="
                        f"{d.eval} names an eval set too. Set data.eval= (empty) to hold out, or data.eval_split to "
                        "a hub split name.")
    sources = parse_sources(d.train, "data.train")
    if not sources:
        raise DataError("data.train is empty; name a .jsonl, .json or .parquet file, builtin:PATH, or a hub dataset.")
    seen: set[str] = set()
    per_source = [_read(s, d.train_split, kind, chat, d.format, columns, seen) for s in sources]
    held: list[Record] | None = None
    if fraction is not None:
        per_source, held = _hold_out(per_source, fraction, seed)
    elif d.eval:
        eval_sources = parse_sources(d.eval, "data.eval")
        held = _mix(eval_sources, [_read(s, d.eval_split, kind, chat, d.format, columns, seen)
                                  for s in eval_sources],
                    seed, "data.eval")
    # A mapping whose key no record has is a typo; left alone it would silently do nothing.
    unused = [f"{s}={t}" for s, t in columns if s not in seen]
    if unused:
        raise DataError(f"data.columns: no record has the key of {', '.join(unused)}; the files' keys are "
                        f"{', '.join(sorted(seen))}. Check the spelling.")
    return _mix(sources, per_source, seed, "data.train"), held


def _hold_out(per_source: list[list[Record]], fraction: float, seed: int):
    """A seeded, disjoint draw over all training records (before weighting, so a repeated record can never be in
    both sets); at least one record on each side."""
    total = sum(len(r) for r in per_source)
    if total < 2:
        raise DataError(f"data.eval_split={fraction:g}: data.train holds {total} record, too few to hold any out. "
                        "Name an eval file with data.eval.")
    count = min(total - 1, max(1, round(fraction * total)))
    chosen = set(random.Random(seed).sample(range(total), count))
    kept, held, index = [], [], 0
    for records in per_source:
        keep = []
        for r in records:
            (held if index in chosen else keep).append(r)
            index += 1
        kept.append(keep)
    log.info("data.eval_split=%g: held out %d of %d data.train records as the eval set (seed train.seed=%d); %d "
             "left to train on", fraction, count, total, seed, total - count)
    return kept, held
