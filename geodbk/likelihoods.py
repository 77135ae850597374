"""Gaussian observation noise with a variance floor.

The objectives take the noise variance as a tensor broadcastable to the batch, so a
heteroscedastic per-point variance (e.g. ``s2_i = s2_floor + s2_meas / tests_i``) can be passed
in place of the scalar one without changing them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

__all__ = ["NOISE_MODELS", "GaussianNoise", "TestsNoise", "inverse_softplus"]

#: Noise models: ``"constant"`` (:class:`GaussianNoise`) and ``"tests"`` (:class:`TestsNoise`).
NOISE_MODELS = ("constant", "tests")


def inverse_softplus(value: float) -> float:
    """Return ``u`` with ``softplus(u) = log(1 + e^u) = value`` (``value > 0``)."""
    if value <= 0:
        raise ValueError(f"inverse_softplus needs a positive value, got {value}")
    if value > 20:
        return float(value)
    return float(math.log(math.expm1(value)))


class GaussianNoise(nn.Module):
    """Homoscedastic Gaussian noise, ``s2 = floor + softplus(raw)``.

    Parameters
    ----------
    init
        Initial variance ``s2`` (1e-2 in the method).
    floor
        Lower bound of ``s2`` (1e-6 in the method).
    """

    def __init__(self, *, init: float = 1e-2, floor: float = 1e-6) -> None:
        super().__init__()
        if init <= floor:
            raise ValueError(f"noise init {init} must exceed the floor {floor}")
        self.floor = float(floor)
        self.raw = nn.Parameter(torch.tensor(inverse_softplus(init - floor)))

    def variance(self, tests: torch.Tensor | float | None = None) -> torch.Tensor:
        """The noise variance ``s2`` as a 0-d tensor (broadcasts; ``tests`` is ignored)."""
        return self.floor + torch.nn.functional.softplus(self.raw)

    def forward(self, tests: torch.Tensor | float | None = None) -> torch.Tensor:
        """Alias of :meth:`variance`."""
        return self.variance(tests)


class TestsNoise(nn.Module):
    """Per-tile noise of an average of ``tests_i`` speed tests.

    ``s2_i = floor + s2_floor + s2_meas / tests_i^p`` with ``s2_floor = softplus(raw_floor)``,
    ``s2_meas = softplus(raw_meas)`` (both learned, positive) and ``p = 1`` or, with
    ``learn_power=True``, ``p = softplus(raw_power)`` (initialised at 1). ``s2_floor`` is the
    variance shared by all tests of a tile (tile-level heterogeneity, quarter-to-quarter change)
    and ``s2_meas`` that of a single test around the tile's mean; ``tests_i = 1`` is one speed
    test, ``tests_i -> inf`` leaves ``s2_floor``.

    Parameters
    ----------
    init
        Initial ``s2`` of a single test (``tests = 1``), split evenly between ``s2_floor`` and
        ``s2_meas``.
    floor
        Lower bound of ``s2_i`` (1e-6).
    learn_power
        Learn the exponent ``p`` of ``tests``.
    """

    def __init__(
        self, *, init: float = 1e-2, floor: float = 1e-6, learn_power: bool = False
    ) -> None:
        super().__init__()
        if init <= floor:
            raise ValueError(f"noise init {init} must exceed the floor {floor}")
        self.floor = float(floor)
        half = inverse_softplus(0.5 * (init - floor))
        self.raw_floor = nn.Parameter(torch.tensor(half))
        self.raw_meas = nn.Parameter(torch.tensor(half))
        self.learn_power = bool(learn_power)
        if self.learn_power:
            self.raw_power = nn.Parameter(torch.tensor(inverse_softplus(1.0)))

    @property
    def s2_floor(self) -> torch.Tensor:
        """``s2_floor`` (0-d): variance left when ``tests -> inf``."""
        return torch.nn.functional.softplus(self.raw_floor)

    @property
    def s2_meas(self) -> torch.Tensor:
        """``s2_meas`` (0-d): variance of a single test around the tile's mean."""
        return torch.nn.functional.softplus(self.raw_meas)

    @property
    def power(self) -> torch.Tensor:
        """Exponent ``p`` of ``tests`` (0-d; 1 unless learned)."""
        if self.learn_power:
            return torch.nn.functional.softplus(self.raw_power)
        return torch.ones((), dtype=self.raw_meas.dtype, device=self.raw_meas.device)

    def variance(self, tests: torch.Tensor | float | None = None) -> torch.Tensor:
        """``s2_i = floor + s2_floor + s2_meas / tests_i^p``; ``tests=None`` means one test.

        Parameters
        ----------
        tests
            Number of tests per point (>= 1), shape (b,) or scalar.
        """
        base = self.floor + self.s2_floor
        if tests is None:
            return base + self.s2_meas
        t = torch.as_tensor(tests, dtype=self.raw_meas.dtype, device=self.raw_meas.device)
        t = t.clamp_min(1.0)
        if self.learn_power:
            return base + self.s2_meas * torch.exp(-self.power * torch.log(t))
        return base + self.s2_meas / t

    def forward(self, tests: torch.Tensor | float | None = None) -> torch.Tensor:
        """Alias of :meth:`variance`."""
        return self.variance(tests)


def noise_parameters(noise: GaussianNoise | TestsNoise, *, y_var: float) -> dict[str, Any]:
    """The learned noise in the target's units: ``{"noise": "constant", "s2"}`` or
    ``{"noise": "tests", "s2_floor", "s2_meas", "power"}`` with
    ``s2_i = s2_floor + s2_meas / tests_i^power``, every variance times ``y_var`` (the
    target's training variance; the numerical floor is folded into ``s2_floor``)."""
    with torch.no_grad():
        if isinstance(noise, TestsNoise):
            return {
                "noise": "tests",
                "s2_floor": y_var * (noise.floor + float(noise.s2_floor)),
                "s2_meas": y_var * float(noise.s2_meas),
                "power": float(noise.power),
            }
        return {"noise": "constant", "s2": y_var * float(noise.variance())}
