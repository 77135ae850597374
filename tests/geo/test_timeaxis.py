"""The time axis (geodbk.geo.timeaxis) and the forecast split (geodbk.geo.table.forecast_split)."""

from __future__ import annotations

import numpy as np
import pytest

from geodbk.errors import DataError
from geodbk.geo.table import forecast_split
from geodbk.geo.timeaxis import (
    TimeScaling,
    format_quarter,
    quarter_index,
    quarter_indices,
    resolve_quarters,
    years_between,
)


def test_quarter_index_round_trip() -> None:
    for year in (1999, 2019, 2023, 2100):
        for k in (1, 2, 3, 4):
            q = f"{year}Q{k}"
            i = quarter_index(q)
            assert i == 4 * year + k - 1
            assert format_quarter(i) == q
    # consecutive indices are consecutive quarters, across a year boundary
    assert format_quarter(quarter_index("2022Q4") + 1) == "2023Q1"
    assert quarter_index("2023-q4") == quarter_index("2023Q4") == quarter_index(" 2023 Q4 ")
    with pytest.raises(DataError, match="2023Q4"):
        quarter_index("2023Q5")
    idx = quarter_indices(["2023Q2", "2019Q1", "2023Q2"])
    assert idx.tolist() == [8093, 8076, 8093]
    assert quarter_indices([]).shape == (0,)
    assert years_between("2019Q4", "2023Q4") == 4.0
    assert years_between("2023Q4", "2023Q2") == -0.5


def test_time_scaling_endpoints_and_extrapolation() -> None:
    ts = TimeScaling("2019Q1", "2023Q4")
    assert ts.span == 19
    assert float(ts.scale("2019Q1")) == -1.0 and float(ts.scale("2023Q4")) == 1.0
    mid = ts.scale_index((quarter_index("2019Q1") + quarter_index("2023Q4")) / 2)
    assert float(mid) == pytest.approx(0.0)
    t = ts.scale(["2019Q1", "2021Q2", "2023Q4", "2024Q4"])
    assert t.shape == (4,) and np.all(np.diff(t) > 0)
    assert t[3] > 1.0  # after `last`: outside [-1, 1]
    # one year is 4 quarters: 8 / span in t
    assert ts.per_year() == pytest.approx(8 / 19)
    assert float(ts.scale("2020Q1") - ts.scale("2019Q1")) == pytest.approx(ts.per_year())
    assert not ts.is_extrapolation("2019Q1") and not ts.is_extrapolation("2023Q4")
    assert ts.is_extrapolation("2024Q1") and ts.is_extrapolation("2018Q4")
    assert ts.describe("2022Q3") == "observed"
    assert ts.describe("2024Q1") == "extrapolation beyond 2023Q4"
    assert ts.describe("2018Q4") == "extrapolation before 2019Q1"
    assert TimeScaling.from_dict(ts.to_dict()) == ts
    got = TimeScaling.from_quarters(["2023Q2", "2019Q1", "2021Q3"])
    assert (got.first, got.last) == ("2019Q1", "2023Q2")
    with pytest.raises(DataError, match="before"):
        TimeScaling("2023Q4", "2019Q1")
    with pytest.raises(DataError, match="first"):
        TimeScaling.from_dict({"last": "2023Q4"})
    with pytest.raises(DataError, match="no quarters"):
        TimeScaling.from_quarters([])


def test_single_quarter_span_is_zero() -> None:
    ts = TimeScaling.from_quarters(["2023Q4", "2023Q4"])
    assert ts.span == 0 and ts.per_year() == 0.0
    assert float(ts.scale("2023Q4")) == 0.0
    assert np.all(ts.scale(["2023Q4", "2024Q2", "2020Q1"]) == 0.0)
    assert ts.is_extrapolation("2024Q1") and ts.describe("2024Q1") == "extrapolation beyond 2023Q4"


def test_resolve_quarters() -> None:
    obs = ["2023Q2", "2023Q1", "2023Q4", "2023Q3", "2023Q1"]
    assert resolve_quarters(None, observed=obs) == ["2023Q4"]
    assert resolve_quarters(None, observed=obs, default="2023q2") == ["2023Q2"]
    assert resolve_quarters([], observed=obs) == ["2023Q4"]
    assert resolve_quarters("all", observed=obs) == ["2023Q1", "2023Q2", "2023Q3", "2023Q4"]
    # a range may reach past the data (extrapolation is the caller's decision)
    assert resolve_quarters("2023Q3:2024Q2", observed=obs) == [
        "2023Q3",
        "2023Q4",
        "2024Q1",
        "2024Q2",
    ]
    assert resolve_quarters("2023Q4", observed=obs) == ["2023Q4"]
    assert resolve_quarters(["2023Q4", "2023Q1", "2023Q4"], observed=obs) == ["2023Q1", "2023Q4"]
    with pytest.raises(DataError, match="before"):
        resolve_quarters("2023Q4:2023Q1", observed=obs)
    with pytest.raises(DataError, match="bad quarter"):
        resolve_quarters("last year", observed=obs)
    with pytest.raises(DataError, match="no quarters"):
        resolve_quarters(None, observed=[])


def test_forecast_split_labels_and_info() -> None:
    rng = np.random.default_rng(3)
    quarters = rng.choice(["2022Q4", "2023Q1", "2023Q2", "2023Q3", "2023Q4"], size=200)
    labels, info = forecast_split(quarters)
    assert info == {
        "test_quarter": "2023Q4",
        "val_quarter": "2023Q3",
        "train_quarters": ["2022Q4", "2023Q1", "2023Q2"],
    }
    assert np.array_equal(labels == "test", quarters == "2023Q4")
    assert np.array_equal(labels == "val", quarters == "2023Q3")
    assert np.array_equal(labels == "train", ~np.isin(quarters, ["2023Q3", "2023Q4"]))
    # the order is by time, not by string: 2023Q1 comes after 2022Q4 across the year boundary
    labels2, info2 = forecast_split(["2023Q1", "2022Q4", "2022Q3", "2023Q1"])
    assert info2["test_quarter"] == "2023Q1" and info2["val_quarter"] == "2022Q4"
    assert labels2.tolist() == ["test", "val", "train", "test"]


def test_forecast_split_needs_three_quarters() -> None:
    with pytest.raises(DataError, match=r"at least 3 quarters.*2023Q3.*2023Q4.*--quarters"):
        forecast_split(["2023Q4", "2023Q3", "2023Q4"])
    with pytest.raises(DataError, match="--split random"):
        forecast_split(["2023Q4"])


def test_quarter_text_adds_a_status_that_says_more_than_the_label() -> None:
    from geodbk.geo.timeaxis import quarter_text

    ts = TimeScaling(first="2021Q1", last="2023Q4")
    assert quarter_text("2023Q4", ts.describe("2023Q4")) == "2023Q4"
    assert quarter_text("2024Q2", ts.describe("2024Q2")) == "2024Q2 (extrapolation beyond 2023Q4)"
    assert quarter_text("2020Q1", ts.describe("2020Q1")) == "2020Q1 (extrapolation before 2021Q1)"
    assert quarter_text("pooled 2022Q1:2023Q4", "pooled") == "pooled 2022Q1:2023Q4"
    offsets = "pooled; tile offsets at 2023Q4"
    assert quarter_text("pooled 2022Q1:2023Q4", offsets) == (
        "pooled 2022Q1:2023Q4 (tile offsets at 2023Q4)"
    )
    assert quarter_text("2023Q4") == "2023Q4" and quarter_text(None) == "?"
