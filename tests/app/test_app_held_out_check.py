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


def _at_thresholds() -> dict[str, Any]:
    well = {
        "tiles": 116,
        "expected_share": 0.144,
        "observed_share": 0.147,
        "sure_served": {"tiles": 0, "stated": None, "held": None},
        "sure_not_served": {"tiles": 55, "stated": 0.947, "held": 0.982},
    }
    rows = [{"label": "≥ 100 Mbps", "threshold": 100.0, "well_measured": well}]
    return _metrics(thresholds={"sure": 0.9, "rows": rows})


def test_the_threshold_caption_reads_the_report_row_of_that_threshold() -> None:
    from app.held_out_check import threshold_check_caption

    attrs = {"quantity": "tile", "model_created": "a"}
    summary = {"model_created": "a"}
    text = threshold_check_caption(_at_thresholds(), summary, attrs, 100.0)
    assert text is not None and text.startswith("Held-out check at ≥ 100 Mbps (geodbk report)")
    assert "at least 90% sure that 55 were not served, and right about 98.2% of them" in text
    assert "were served and" not in text  # no tile it was sure was served
    assert "expected 14.4% of them served; 14.7% were" in text
    # another threshold, another training or a report before the threshold check: none
    assert threshold_check_caption(_at_thresholds(), summary, attrs, 25.0) is None
    assert threshold_check_caption(_at_thresholds(), {"model_created": "b"}, attrs, 100.0) is None
    assert threshold_check_caption(_metrics(), summary, attrs, 100.0) is None
