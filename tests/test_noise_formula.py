"""The tests-aware noise formula, one definition for the model (torch) and saved parameters
(numpy): s2_i = floor_i + s2_meas / tests_i^p [+ s2_dev / devices_i^q]."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geodbk.likelihoods import TestsNoise, noise_parameters
from geodbk.noise_formula import noise_terms, noise_variance


def _noise(*, learn_power: bool, devices: bool, urban: bool) -> TestsNoise:
    noise = TestsNoise(init=0.3, learn_power=learn_power, devices=devices, urban=urban).double()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in noise.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return noise


@pytest.mark.parametrize("learn_power", [False, True])
@pytest.mark.parametrize("devices", [False, True])
@pytest.mark.parametrize("urban", [False, True])
def test_saved_parameters_give_the_models_variance(
    learn_power: bool, devices: bool, urban: bool
) -> None:
    """noise_variance(noise_parameters(model)) equals y_var times the model's own s2_i."""
    rng = np.random.default_rng(0)
    n = 50
    tests = rng.integers(1, 40, n).astype(np.float64)
    dev = np.minimum(tests, rng.integers(1, 20, n)).astype(np.float64)
    is_urban = rng.integers(0, 2, n).astype(np.float64)
    cols = [tests] + ([dev] if devices else []) + ([is_urban] if urban else [])
    noise = _noise(learn_power=learn_power, devices=devices, urban=urban)
    cov = torch.as_tensor(np.column_stack(cols) if len(cols) > 1 else tests)
    y_var = 0.37
    with torch.no_grad():
        expected = y_var * noise.variance(cov).numpy()
    params = noise_parameters(noise, y_var=y_var)
    got = noise_variance(
        params,
        tests=tests,
        devices=dev if devices else None,
        is_urban=is_urban if urban else None,
    )
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    if urban:
        with pytest.raises(ValueError, match="is_urban"):
            noise_variance(params, tests=tests)


def test_terms_are_the_same_for_torch_and_numpy_and_gradients_flow() -> None:
    tests = np.array([1.0, 2.0, 9.0])
    power = torch.tensor(0.8, dtype=torch.float64, requires_grad=True)
    t_terms = noise_terms(
        floor=torch.tensor(0.1, dtype=torch.float64),
        s2_meas=torch.tensor(0.5, dtype=torch.float64),
        tests=torch.as_tensor(tests),
        power=power,
        s2_dev=torch.tensor(0.2, dtype=torch.float64),
        devices=torch.tensor([1.0, 1.0, 3.0], dtype=torch.float64),
    )
    n_terms = noise_terms(
        floor=0.1, s2_meas=0.5, tests=tests, power=0.8, s2_dev=0.2, devices=np.array([1, 1, 3.0])
    )
    for a, b in zip(t_terms, n_terms, strict=True):
        np.testing.assert_allclose(torch.as_tensor(a).detach().numpy(), b, rtol=1e-15)
    sum(t_terms[1:], t_terms[0]).sum().backward()
    assert power.grad is not None and float(power.grad) < 0  # more tests per power: less noise
    np.testing.assert_allclose(n_terms[1], 0.5 / tests**0.8, rtol=1e-15)
    assert noise_terms(floor=0.0, s2_meas=1.0, tests=3.0)[1] == 1.0 / 3.0  # exact division


def test_constant_and_unknown_models() -> None:
    assert noise_variance({"noise": "constant", "s2": 0.09}, tests=5.0) == 0.09
    with pytest.raises(ValueError, match="unknown noise model"):
        noise_variance({"noise": "student-t"}, tests=1.0)
    with pytest.raises(KeyError):
        noise_variance({"noise": "tests", "s2_floor": 0.1}, tests=1.0)
