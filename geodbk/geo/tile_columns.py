"""Values of a tile table's columns as agencies and spreadsheets write them: quarters, numbers
with thousands separators and the network type.

Each parser returns what it could read and leaves the rest missing; the readers count those rows
and refuse a column that is mostly unreadable, naming the file, the column and a value.
"""

from __future__ import annotations

import re

import pandas as pd

from geodbk.errors import DataError

__all__ = [
    "QUARTER_FORMS",
    "TYPE_COLUMNS",
    "numbers",
    "padded_number_quadkeys",
    "padded_quadkeys",
    "quarters_of",
    "refuse_unreadable",
    "row_types",
]

#: The quarter forms :func:`quarters_of` reads, for messages.
QUARTER_FORMS = (
    "2023Q4, 2023-Q4, 2023 Q4, Q4 2023, Q4-2023, 2023-4, 2023_4 or 2023.4, a date in the quarter "
    "(2023-10-01), or year and quarter columns"
)
#: Columns that may name each row's network type (lower case).
TYPE_COLUMNS: tuple[str, ...] = ("type", "network_type", "conn_type", "connection_type")

_YEAR_FIRST = re.compile(r"^(\d{4})\s*[-_ /.]?\s*Q?([1-4])$")
_QUARTER_FIRST = re.compile(r"^Q([1-4])\s*[-_ /]?\s*(\d{4})$")
_DATE = re.compile(r"^(\d{4})-(\d{1,2})-\d{1,2}(?:[ T].*)?$")
_GROUPED = re.compile(r"^[+-]?\d{1,3}(?:[,\u00a0\u202f ]\d{3})+(?:\.\d+)?$")


def _quarter_text(text: pd.Series) -> pd.Series:
    """``YYYYQn`` of each text value, ``""`` where it is not a quarter form."""
    t = text.fillna("").astype(str).str.strip().str.upper()
    out = pd.Series("", index=t.index, dtype=object)
    for pattern, year, quarter in ((_YEAR_FIRST, 1, 2), (_QUARTER_FIRST, 2, 1)):
        parts = t.str.extract(pattern)
        hit = parts[0].notna() & (out == "")
        out[hit] = parts.loc[hit, year - 1] + "Q" + parts.loc[hit, quarter - 1]
    dates = t.str.extract(_DATE)
    months = pd.to_numeric(dates[1], errors="coerce")
    hit = (out == "") & months.between(1, 12)
    out[hit] = dates.loc[hit, 0] + "Q" + ((months[hit] - 1) // 3 + 1).astype(int).astype(str)
    return out


def quarters_of(df: pd.DataFrame, *, dates: bool = True) -> tuple[pd.Series, str] | None:
    """Each row's quarter ``YYYYQn`` (``""`` where unreadable) and the column(s) it came from, or
    ``None`` when the table has no quarter column.

    Read from, in order: a ``quarter`` column of any form in :data:`QUARTER_FORMS` (a number
    1-4 there takes its year from a ``year`` column), with ``dates`` a ``date`` column (the
    quarter the date falls in; a date may be something else, such as when a file was exported,
    so a caller that knows the quarter from elsewhere passes ``dates=False``). ``df``'s column
    names are lower case.
    """
    if "quarter" in df.columns:
        q = df["quarter"]
        if "year" in df.columns and pd.to_numeric(q, errors="coerce").isin([1, 2, 3, 4]).any():
            year = pd.to_numeric(df["year"], errors="coerce")
            num = pd.to_numeric(q, errors="coerce")
            ok = year.between(1000, 9999) & num.isin([1, 2, 3, 4])
            out = pd.Series("", index=df.index, dtype=object)
            out[ok] = year[ok].astype(int).astype(str) + "Q" + num[ok].astype(int).astype(str)
            return out, "year, quarter"
        if pd.api.types.is_datetime64_any_dtype(q):
            q = q.dt.strftime("%Y-%m-%d")
        return _quarter_text(q), "quarter"
    if dates and "date" in df.columns:
        d = df["date"]
        if pd.api.types.is_datetime64_any_dtype(d):
            d = d.dt.strftime("%Y-%m-%d")
        return _quarter_text(d.astype("string")), "date"
    return None


def numbers(values: pd.Series) -> pd.Series:
    """``values`` as float64: numbers, and text of numbers, also with thousands separators
    (``12,345``, ``12 345``); anything else is NaN."""
    if pd.api.types.is_numeric_dtype(values):
        return pd.to_numeric(values, errors="coerce").astype("float64")
    text = values.astype("string").str.strip()
    grouped = text.str.fullmatch(_GROUPED).fillna(False).astype(bool)
    text = text.where(~grouped, text.str.replace(r"[,\u00a0\u202f ]", "", regex=True))
    return pd.to_numeric(text, errors="coerce").astype("float64")


def row_types(df: pd.DataFrame) -> tuple[pd.Series, str] | None:
    """Each row's network type (``mobile``/``fixed``, ``""`` otherwise) from the first of
    :data:`TYPE_COLUMNS` whose values are mostly those words (case and spaces ignored), and that
    column's name; ``None`` when no column names types."""
    for col in TYPE_COLUMNS:
        if col not in df.columns:
            continue
        t = df[col].astype("string").str.strip().str.lower().fillna("")
        known = t.isin(["mobile", "fixed"])
        if known.mean() >= 0.5:
            return t.where(known, ""), col
    return None


def refuse_unreadable(
    read: pd.Series, raw: pd.Series, *, path: object, column: str, what: str
) -> None:
    """Raise :class:`DataError` when over half of ``raw``'s non-empty values could not be read
    (``read`` missing or empty there), naming ``path``, ``column``, a value and ``what`` the
    column should hold."""
    given = raw.notna() & (raw.astype("string").str.strip() != "")
    failed = given & (read.isna() | (read.astype("string") == ""))
    n, bad = int(given.sum()), int(failed.sum())
    if n and bad * 2 > n:
        example = str(raw[failed].iloc[0])
        raise DataError(
            f"{path}: column {column!r} holds {bad:,} of {n:,} values that cannot be read "
            f"(e.g. {example!r}); it should hold {what}. Fix the column or re-export the table"
        )


def padded_number_quadkeys(values: pd.Series, *, zoom: int) -> tuple[pd.Series, int]:
    """A column of quadkeys stored as numbers (which lost their leading zeros) as text
    zero-padded back to ``zoom`` digits (``""`` where missing), and how many were padded."""
    whole = pd.to_numeric(values, errors="coerce").round().astype("Int64")
    text = whole.astype("string").fillna("").astype(str)
    short = int(((text.str.len() < zoom) & (text != "")).sum())
    return text.where(text == "", text.str.zfill(zoom)), short


def padded_quadkeys(text: pd.Series, *, zoom: int) -> tuple[pd.Series, int]:
    """Quadkeys written by a spreadsheet or CSV as numbers, zero-padded back to ``zoom`` digits
    when every key is ``zoom - 2`` to ``zoom`` digits (a zoom-16 key in quadrant 0 loses one
    zero, Alaska's north two; shorter keys were cut, not padded); the keys and how many were
    padded. ``""`` is a missing key; a trailing ``.0`` (a float's) is dropped."""
    keys = text.str.replace(r"^(\d+)\.0*$", r"\1", regex=True)
    given = keys[keys != ""]
    if not len(given) or not given.str.fullmatch(rf"\d{{{zoom - 2},{zoom}}}").all():
        return keys, 0
    short = int((given.str.len() < zoom).sum())
    return keys.where(keys == "", keys.str.zfill(zoom)), short
