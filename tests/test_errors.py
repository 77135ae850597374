"""The exception types: distinct exit codes, and DataError is a ValueError."""

from __future__ import annotations

from geodbk.errors import DataError, GeodbkError, ModelFileError, RunDirectoryError


def test_error_types_have_distinct_exit_codes() -> None:
    codes = {cls.exit_code for cls in (GeodbkError, DataError, ModelFileError, RunDirectoryError)}
    assert len(codes) == 4
    assert issubclass(DataError, ValueError)
