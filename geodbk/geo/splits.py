"""What a tile table's train/val/test split is, in words (its ``split`` metadata, written by
``geodbk ingest``), for the report, the benchmark and the dashboard."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["split_sentence"]


def _quarter_span(quarters: Sequence[str]) -> str:
    qs = list(quarters)
    if not qs:
        return "none"
    return qs[0] if len(qs) == 1 else f"{qs[0]}–{qs[-1]} ({len(qs)})"


def split_sentence(split: dict[str, Any] | None) -> str:
    """One sentence naming the train/val/test split of ``tiles.parquet`` (its ``split`` metadata).

    ``random``: rows drawn at random from every quarter; ``tile``: whole tiles held out (every
    quarter); ``block``: whole spatial blocks held out; ``forecast``: the last quarter is the
    test set and the one before it validation.
    """
    s = split if isinstance(split, dict) else {}
    kind = s.get("kind", "unknown")
    counts = s.get("counts")
    tail = (
        f" Rows: {counts.get('train')} train, {counts.get('val')} val, {counts.get('test')} test."
        if isinstance(counts, dict)
        else ""
    )
    if kind == "forecast":
        return (
            f"Split: forecast — test quarter {s.get('test_quarter')}, validation quarter "
            f"{s.get('val_quarter')}, training quarters "
            f"{_quarter_span(s.get('train_quarters') or [])}; the test set is a quarter the "
            f"model never saw.{tail}"
        )
    if kind == "block":
        return (
            f"Split: spatial blocks of {s.get('block_size_deg')}° held out whole (seed "
            f"{s.get('seed')}); test tiles lie in areas without training tiles.{tail}"
        )
    if kind == "tile":
        return (
            f"Split: whole tiles held out (seed {s.get('seed')}); every quarter of a test tile "
            f"is held out, so test tiles were never measured but have measured neighbours.{tail}"
        )
    if kind == "random":
        return (
            f"Split: random rows (seed {s.get('seed')}); test rows come from every quarter "
            f"and area.{tail}"
        )
    return f"Split: {kind}.{tail}"
