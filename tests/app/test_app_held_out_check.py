"""The Map tab's line on the report's held-out check (app.held_out_check)."""

from __future__ import annotations

from typing import Any

from app.held_out_check import held_out_check_caption

BUSY = {
    "tiles": 116,
    "coverage95": 0.983,
    "coverage95_interval": [0.939, 0.998],
    "coverage95_interval_by_place": [0.96, 0.999],
}
LESS = {"min_tests": 5, "max_tests": 30, "tiles": 166}
LESS |= {"all": {"tiles": 166, "coverage95": 0.952, "coverage95_interval": [0.91, 0.98]}}


def _metrics(**cal: Any) -> dict[str, Any]:
    return {"map_calibration": {"min_tests": 30, "tile": {"all": BUSY}, **cal}}


def test_the_caption_reads_both_checks_of_the_same_training() -> None:
    attrs = {"quantity": "tile", "model_created": "2026-12-06T21:00:00+00:00"}
    summary = {"model_created": attrs["model_created"]}
    text = held_out_check_caption(_metrics(tile_less_measured=LESS), summary, attrs)
    assert text is not None
    assert (
        "98.3% of 116 well-measured test tiles (30+ tests; by place: the intervals too wide)"
        in text
    )
    assert "95.2% of 166 less measured ones (5–29 tests; by tile: 95% inside its interval)" in text


def test_no_caption_for_another_quantity_training_or_a_report_without_the_check() -> None:
    attrs = {"quantity": "tile", "model_created": "a"}
    assert held_out_check_caption(_metrics(), {"model_created": "b"}, attrs) is None
    assert held_out_check_caption(_metrics(), None, {**attrs, "quantity": "area"}) is None
    assert held_out_check_caption({"metrics": {}}, None, attrs) is None
    assert held_out_check_caption(None, None, attrs) is None
    # a report written before the less measured tiles (or a summary without the training's
    # stamp): the well-measured check alone
    text = held_out_check_caption(_metrics(), {}, attrs)
    assert text is not None and "less measured" not in text
