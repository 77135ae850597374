"""The noise models: GaussianNoise's floor, TestsNoise's formula and power."""

from __future__ import annotations

import math

import pytest
import torch

from geodbk.likelihoods import GaussianNoise
from geodbk.likelihoods import TestsNoise as _TestsNoise  # (not a test class)


def test_noise_init_and_floor() -> None:
    noise = GaussianNoise(init=1e-2, floor=1e-6)
    assert float(noise.variance()) == pytest.approx(1e-2, rel=1e-6)
    with torch.no_grad():
        noise.raw.fill_(-1e4)
    assert float(noise.variance().detach()) == pytest.approx(1e-6, rel=1e-6)


def test_tests_noise_formula_and_power() -> None:
    noise = _TestsNoise(init=0.3, floor=1e-6).double()
    tests = torch.tensor([1.0, 2.0, 4.0, 100.0], dtype=torch.float64)
    s2 = noise.variance(tests)
    expected = 1e-6 + noise.s2_floor + noise.s2_meas / tests
    torch.testing.assert_close(s2, expected)
    torch.testing.assert_close(noise.variance(None), noise.variance(torch.tensor(1.0)))
    assert float(noise.variance(1.0).detach()) == pytest.approx(0.3, rel=1e-6)
    assert bool((s2[1:] < s2[:-1]).all())
    powered = _TestsNoise(init=0.3, learn_power=True).double()
    assert float(powered.power) == pytest.approx(1.0)
    with torch.no_grad():
        powered.raw_power.fill_(math.log(math.expm1(0.5)))
    torch.testing.assert_close(
        powered.variance(tests), 1e-6 + powered.s2_floor + powered.s2_meas / tests**0.5
    )
    # the constant noise ignores tests
    const = GaussianNoise(init=0.2)
    assert float(const.variance(tests)) == pytest.approx(0.2, rel=1e-6)
