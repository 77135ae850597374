"""The observation-noise formula of the tests-aware noise models, for torch tensors (the model
in training) and numpy arrays or floats (saved parameters, e.g. a grid's attributes).

    s2_i = floor_i + s2_meas / tests_i^p [+ s2_dev / devices_i^q]

``floor_i`` is the noise floor (one value, or the tile's urban/rural class floor), ``tests_i``
and ``devices_i`` the tile's number of tests and of devices, each at least 1. Only arithmetic
operators are used, so every operand may be a tensor (gradients flow) or an array; nothing
heavy is imported, so the dashboard evaluates it without the model stack.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["class_floor", "noise_terms", "noise_variance"]


def noise_terms(
    *,
    floor: Any,
    s2_meas: Any,
    tests: T,
    power: Any = 1.0,
    s2_dev: Any = None,
    devices: Any = None,
    power_devices: Any = 1.0,
) -> list[Any]:
    """The terms ``[floor, s2_meas / tests^p]`` and, when ``s2_dev`` is given, ``s2_dev /
    devices^q`` (``devices`` defaults to ``tests``: one device per test). ``tests`` and
    ``devices`` must already be clamped to >= 1. A fixed exponent of 1 divides exactly."""
    terms = [floor, s2_meas / tests if _is_one(power) else s2_meas / tests**power]
    if s2_dev is not None:
        count = tests if devices is None else devices
        terms.append(s2_dev / count if _is_one(power_devices) else s2_dev / count**power_devices)
    return terms


def class_floor(*, rural: Any, urban: Any, is_urban: Any) -> Any:
    """The floor of a tile's class, ``(1 - u) rural + u urban`` with ``u`` in [0, 1]."""
    return (1.0 - is_urban) * rural + is_urban * urban


def noise_variance(
    params: Mapping[str, Any], *, tests: Any, devices: Any = None, is_urban: Any = None
) -> Any:
    """``s2_i`` from saved noise parameters (:func:`geodbk.likelihoods.noise_parameters`:
    ``noise`` = ``constant`` with ``s2``, or ``tests``/``tests+devices`` with ``s2_floor``,
    ``s2_meas``, ``power`` and ``s2_dev``, ``power_devices``, and ``s2_floor_urban`` for a
    floor per class, which then needs ``is_urban``). Raises ``KeyError`` for a missing
    parameter and ``ValueError`` for an unknown noise model."""
    model = params["noise"]
    if model == "constant":
        return params["s2"]
    if model not in ("tests", "tests+devices"):
        raise ValueError(f"unknown noise model {model!r}")
    floor = params["s2_floor"]
    if "s2_floor_urban" in params:
        if is_urban is None:
            raise ValueError("this noise has a floor per urban/rural class: give is_urban")
        floor = class_floor(rural=floor, urban=params["s2_floor_urban"], is_urban=is_urban)
    terms = noise_terms(
        floor=floor,
        s2_meas=params["s2_meas"],
        tests=tests,
        power=params.get("power", 1.0),
        s2_dev=params["s2_dev"] if model == "tests+devices" else None,
        devices=devices,
        power_devices=params.get("power_devices", 1.0),
    )
    return sum(terms[1:], terms[0])


def _is_one(exponent: Any) -> bool:
    """Whether ``exponent`` is the plain number 1 (a tensor exponent may be learned)."""
    return isinstance(exponent, int | float) and exponent == 1.0
