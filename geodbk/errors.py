"""Exception types shared by the library, the pipelines and the app.

Every error a user can cause (bad file, bad column, missing run) is one of these, with a message
that names the file, the problem and the fix. The CLI maps them to exit codes.
"""

from __future__ import annotations


class GeodbkError(Exception):
    """Base class of all errors geodbk raises on purpose."""

    exit_code: int = 1


class DataError(GeodbkError, ValueError):
    """Input data that cannot be used: unreadable file, missing column, bad values."""

    exit_code = 3


class ModelFileError(GeodbkError):
    """A model bundle that is missing, corrupt, foreign or from an incompatible version."""

    exit_code = 4


class RunDirectoryError(GeodbkError):
    """A run directory that is missing, partial or lacks what a stage needs."""

    exit_code = 5


class TrainingDivergedError(GeodbkError, FloatingPointError):
    """The training loss (or the validation NLL) became NaN or infinite."""
