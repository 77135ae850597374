"""Fitted parameters as the dashboard writes them: significant figures, powers of ten, units."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app import params as P


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.14622732739895825, "0.146"),
        (3.145481931110369, "3.15"),
        (2.0, "2"),
        (0.0468, "0.0468"),
        (0.00123, "0.00123"),
        (-0.0429, "-0.0429"),
        (12345.6, "12,346"),
        (1.2164246679392026e-08, "1.22 × 10⁻⁸"),
        (6.42714051499461e-10, "6.43 × 10⁻¹⁰"),
        (1.0000000000000004e-06, "1 × 10⁻⁶"),
        (9.9996e-09, "1 × 10⁻⁸"),  # rounding carries into the next power of ten
        (2.5e7, "2.5 × 10⁷"),
        (0.0, "0"),
        (np.float32(0.5), "0.5"),
        (np.int64(16), "16"),
        (math.nan, "–"),
        (None, "–"),
        (True, "–"),
        ("0.3", "–"),
    ],
)
def test_format_number(value: object, text: str) -> None:
    assert P.format_number(value) == text


def test_units_follow_the_value_or_the_groups() -> None:
    assert P.with_unit(0.0468, P.VARIANCE_UNIT) == "0.0468 log10²"
    assert P.with_unit(3.1454, P.RANGE_UNIT) == "3.15 km"
    groups = {"rural": 0.146, "urban": 0.198}
    assert P.per_group(groups, P.VARIANCE_UNIT) == "rural 0.146, urban 0.198 log10²"
    assert P.per_group({"all": 0.25}, P.VARIANCE_UNIT) == "0.25 log10²"
    assert P.per_group(0.25, P.VARIANCE_UNIT) == "0.25 log10²"
    assert P.per_group({}, P.RHO_UNIT) == "– per quarter"


def test_prefixed_reads_one_attribute_per_group_in_order() -> None:
    attrs = {"x_urban": 2.0, "x_rural": 1.0, "y_rural": 3.0}
    assert P.prefixed(attrs, "x_") == {"rural": 1.0, "urban": 2.0}
    assert list(P.prefixed(attrs, "x_")) == ["rural", "urban"]
    assert P.prefixed(attrs, "z_") == {}
