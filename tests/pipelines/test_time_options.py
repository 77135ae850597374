"""The --quarter and --trend options of the stages that read time-aware grids."""

from __future__ import annotations

import argparse

import pytest

from geodbk.errors import DataError
from pipelines.time_options import add_time_options, parse_trend


def test_trend_specs_are_two_quarters_in_order() -> None:
    assert parse_trend("2019Q4:2023-Q4") == ("2019Q4", "2023Q4")
    assert parse_trend(" 2019q4 : 2023Q4 ") == ("2019Q4", "2023Q4")
    with pytest.raises(DataError, match="FIRST:LAST"):
        parse_trend("2019Q4")
    with pytest.raises(DataError, match="must be after 2023Q4"):
        parse_trend("2023Q4:2023Q4")
    with pytest.raises(DataError, match="must be after 2023Q4"):
        parse_trend("2023Q4:2019Q4")


def test_quarter_and_trend_are_exclusive_with_their_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="geodbk export")
    add_time_options(parser, quarter="which quarter's map", trend="a change per year")
    args = parser.parse_args(["--quarter", "2023Q4"])
    assert args.quarter == "2023Q4" and args.trend is None
    assert parser.parse_args([]).quarter is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--quarter", "2023Q4", "--trend", "2019Q4:2023Q4"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    out = capsys.readouterr().out
    assert "which quarter's map" in out and "a change per year" in out
