"""Quarters, numbers and network types as agencies and spreadsheets write them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from geodbk.errors import DataError
from geodbk.geo.tile_columns import numbers, quarters_of, refuse_unreadable, row_types


@pytest.mark.parametrize(
    "value",
    [
        "2023Q4",
        "2023-Q4",
        "2023 q4",
        "Q4 2023",
        "q4-2023",
        "2023-4",
        "2023_4",
        "2023.4",
        "2023-11-15",
    ],
)
def test_every_quarter_form_reads_as_the_quarter(value: str) -> None:
    q, source = quarters_of(pd.DataFrame({"quarter": [value]}))  # type: ignore[misc]
    assert q.tolist() == ["2023Q4"] and source == "quarter"


def test_quarter_from_year_and_quarter_columns_a_date_column_or_none() -> None:
    q, source = quarters_of(pd.DataFrame({"year": [2022, 2023], "quarter": [1, 4]}))  # type: ignore[misc]
    assert q.tolist() == ["2022Q1", "2023Q4"] and source == "year, quarter"
    dates = pd.DataFrame({"date": pd.to_datetime(["2021-02-01", "2021-12-31"])})
    q, source = quarters_of(dates)  # type: ignore[misc]
    assert q.tolist() == ["2021Q1", "2021Q4"] and source == "date"
    assert quarters_of(pd.DataFrame({"tests": [1]})) is None
    q, _ = quarters_of(pd.DataFrame({"quarter": ["2023Q5", "autumn", None]}))  # type: ignore[misc]
    assert q.tolist() == ["", "", ""]


def test_numbers_with_thousands_separators() -> None:
    got = numbers(pd.Series(["12,345", "1,234,567.5", "987", " 45 ", "12,5", "n/a", None]))
    want = [12345.0, 1234567.5, 987.0, 45.0, np.nan, np.nan, np.nan]
    np.testing.assert_array_equal(got.to_numpy(), want)  # "12,5" is no thousands grouping
    assert numbers(pd.Series([3, 4])).dtype == np.float64


def test_a_mostly_unreadable_column_is_refused_naming_file_column_and_value() -> None:
    raw = pd.Series(["fast", "slow", "12"])
    with pytest.raises(DataError, match=r"t\.csv: column 'avg_d_kbps' holds 2 of 3 .*'fast'"):
        refuse_unreadable(numbers(raw), raw, path="t.csv", column="avg_d_kbps", what="numbers")
    ok = pd.Series(["1", "2", "x"])  # one bad row of three: dropped and counted, not refused
    refuse_unreadable(numbers(ok), ok, path="t.csv", column="tests", what="numbers")


def test_row_types_from_a_type_column() -> None:
    kinds, column = row_types(pd.DataFrame({"network_type": ["Mobile", " fixed", "?"]}))  # type: ignore[misc]
    assert kinds.tolist() == ["mobile", "fixed", ""] and column == "network_type"
    assert row_types(pd.DataFrame({"type": ["a", "b"]})) is None  # not network types
    assert row_types(pd.DataFrame({"tests": [1]})) is None
