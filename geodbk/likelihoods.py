"""Gaussian observation noise with a variance floor.

The objectives take the noise variance as a tensor broadcastable to the batch, so a
heteroscedastic per-point variance (e.g. ``s2_i = s2_floor + s2_meas / tests_i``) can be passed
in place of the scalar one without changing them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["GaussianNoise", "inverse_softplus"]


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

    def variance(self) -> torch.Tensor:
        """The noise variance ``s2`` as a 0-d tensor (broadcasts against any batch)."""
        return self.floor + torch.nn.functional.softplus(self.raw)

    def forward(self) -> torch.Tensor:
        """Alias of :meth:`variance`."""
        return self.variance()
