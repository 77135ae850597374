"""The split's sentence for the report, the benchmark and the dashboard."""

from __future__ import annotations

from geodbk.geo.splits import split_sentence


def test_split_sentences_name_each_kind_and_the_row_counts() -> None:
    counts = {"train": 80, "val": 10, "test": 10}
    forecast = split_sentence(
        {
            "kind": "forecast",
            "test_quarter": "2023Q4",
            "val_quarter": "2023Q3",
            "train_quarters": ["2023Q1", "2023Q2"],
            "counts": counts,
        }
    )
    assert "test quarter 2023Q4, validation quarter 2023Q3" in forecast
    assert "training quarters 2023Q1–2023Q2 (2)" in forecast
    assert forecast.endswith("Rows: 80 train, 10 val, 10 test.")
    assert "spatial blocks of 0.5°" in split_sentence({"kind": "block", "block_size_deg": 0.5})
    assert "whole tiles held out (seed 3)" in split_sentence({"kind": "tile", "seed": 3})
    assert split_sentence({"kind": "random", "seed": 1}).startswith("Split: random rows (seed 1)")
    assert split_sentence(None) == "Split: unknown."
