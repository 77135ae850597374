"""How the dashboard writes fitted model parameters: readable numbers with their units.

The tile effect and the local layer record their parameters on the log10 scale of the target
(``tau²``, ``sigma²`` are variances of log10 values: log10²), the local layer's range in km,
the offsets' correlation between consecutive quarters (``rho``, per quarter) and ``lambda``, a
multiple of the GP's latent variance. Tiny fitted values (a variance driven to its floor,
``1.2e-08``) are written as ``1.22 × 10⁻⁸`` rather than as ``0.0000`` or ``1.22e-08``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

#: Units of the parameters, as written after their values.
VARIANCE_UNIT = "log10²"
RANGE_UNIT = "km"
RHO_UNIT = "per quarter"
LAMBDA_UNIT = "of the GP's variance"

_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def as_number(value: Any) -> float:
    """``value`` as a float (NaN for anything that is not a real number, booleans included;
    numpy scalars read as numbers)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return math.nan
    return float(value)


def format_number(value: Any, digits: int = 3) -> str:
    """``digits`` significant figures, trailing zeros dropped; powers of ten with superscripts
    outside [0.001, 100000) (``1.22 × 10⁻⁸``); ``–`` for a missing or non-finite value.

    >>> format_number(0.14622), format_number(3.145), format_number(2.0)
    ('0.146', '3.15', '2')
    >>> format_number(1.2164e-08), format_number(1e-06)
    ('1.22 × 10⁻⁸', '1 × 10⁻⁶')
    """
    x = as_number(value)
    if not math.isfinite(x):
        return "–"
    if x == 0:
        return "0"
    exponent = math.floor(math.log10(abs(x)))
    if -3 <= exponent < 5:
        decimals = max(digits - 1 - exponent, 0)
        text = f"{x:,.{decimals}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa = f"{x / 10.0**exponent:.{digits - 1}f}".rstrip("0").rstrip(".")
    if mantissa in ("10", "-10"):  # rounding carried into the next power
        mantissa, exponent = mantissa[:-1], exponent + 1
    return f"{mantissa} × 10{str(exponent).translate(_SUPERSCRIPT)}"


def with_unit(value: Any, unit: str, digits: int = 3) -> str:
    """``0.0468 log10²``: the value (:func:`format_number`) and its unit."""
    return f"{format_number(value, digits)} {unit}".strip()


def per_group(values: Any, unit: str, digits: int = 3) -> str:
    """One parameter per urban/rural group: ``rural 0.146, urban 0.198 log10²``; a single value
    (a float, or ``{"all": x}``) reads ``0.146 log10²``."""
    if isinstance(values, Mapping):
        groups = {str(k): v for k, v in values.items()}
        if list(groups) == ["all"]:
            values = groups["all"]
        elif groups:
            text = ", ".join(f"{g} {format_number(v, digits)}" for g, v in groups.items())
            return f"{text} {unit}".strip()
    return with_unit(values, unit, digits)


def prefixed(attrs: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """``{group: value}`` of the attributes named ``PREFIX<group>``, sorted by group."""
    return {k.removeprefix(prefix): v for k, v in sorted(attrs.items()) if k.startswith(prefix)}
