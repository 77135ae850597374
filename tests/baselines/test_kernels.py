"""The baselines' kernels and row order (geodbk/baselines/kernels.py): the Matérn-3/2 kernel
against its closed form, the RBF kernel, the kernel by name, positive parameters, the
Cholesky with relative jitter and the Morton (Z-order) permutation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from geodbk.baselines.kernels import (
    Positive,
    far_centre,
    inv_softplus,
    kernel_fn,
    matern32_ard,
    morton_order,
    psd_cholesky,
    rbf_ard,
    scaled_sqdist,
)


def test_matern_kernel_matches_closed_form() -> None:
    a = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[0.3, -0.4]], dtype=torch.float64)
    ls = torch.tensor([0.5, 0.5], dtype=torch.float64)
    rho = 1.0  # ||(0.3, -0.4)|| / 0.5
    expected = 2.0 * (1 + math.sqrt(3) * rho) * math.exp(-math.sqrt(3) * rho)
    got = matern32_ard(a, b, lengthscale=ls, outputscale=torch.tensor(2.0, dtype=torch.float64))
    assert float(got) == pytest.approx(expected, rel=1e-12)


def test_morton_order_is_deterministic_and_z_shaped() -> None:
    g = np.array([[x, y] for y in range(4) for x in range(4)], dtype=float)
    order = morton_order(g)
    assert [tuple(g[i]) for i in order[:4]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (500, 2))
    np.testing.assert_array_equal(morton_order(X), morton_order(X.copy()))


def test_rbf_kernel_positive_parameters_and_relative_jitter() -> None:
    """rbf_ard against its closed form; kernel_fn picks by name; Positive starts at its value;
    psd_cholesky factorises a singular PSD matrix with the jitter relative to its diagonal."""
    a = torch.tensor([[0.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[0.3, -0.4]], dtype=torch.float64)
    ls = torch.tensor([0.5, 1.0], dtype=torch.float64)
    s = torch.tensor(2.0, dtype=torch.float64)
    expected = 2.0 * math.exp(-0.5 * ((0.3 / 0.5) ** 2 + 0.4**2))
    assert float(rbf_ard(a, b, lengthscale=ls, outputscale=s)) == pytest.approx(expected, rel=1e-12)
    assert kernel_fn("rbf") is rbf_ard and kernel_fn("matern32") is matern32_ard
    with pytest.raises(ValueError, match="unknown kernel"):
        kernel_fn("matern52")
    p = Positive(0.3, shape=(2,))
    assert p.raw.shape == (2,)
    torch.testing.assert_close(p().detach(), torch.full((2,), 0.3), rtol=1e-6, atol=0.0)
    assert inv_softplus(30.0) == 30.0
    ones = torch.full((3, 3), 4.0, dtype=torch.float64)  # rank 1: no Cholesky without jitter
    chol = psd_cholesky(ones, jitter=1e-6)
    assert torch.equal(chol, torch.tril(chol))
    expected_matrix = ones + 1e-6 * 4.0 * torch.eye(3, dtype=torch.float64)  # 1e-6 x mean diag
    torch.testing.assert_close(chol @ chol.T, expected_matrix, rtol=0.0, atol=1e-12)


def test_float32_distances_hold_far_from_the_origin() -> None:
    """Raw lon/lat (Hawaii: about -157, 21) in float32: the matmul form of the squared distance
    cancels to noise there, which made RBF and Matérn Gram matrices indefinite; the kernels
    depend on differences only, so they match float64 and stay positive definite."""
    rng = np.random.default_rng(0)
    pts = np.array([-157.8, 21.3]) + rng.uniform(-0.05, 0.05, (64, 2))
    ls = torch.tensor([0.01, 0.01])
    for kernel in (rbf_ard, matern32_ard):
        K64 = kernel(
            torch.as_tensor(pts), torch.as_tensor(pts), lengthscale=ls.double(), outputscale=1.0
        )
        p32 = torch.as_tensor(pts, dtype=torch.float32)
        K32 = kernel(p32, p32, lengthscale=ls, outputscale=1.0)
        np.testing.assert_allclose(K32.double().numpy(), K64.numpy(), atol=1e-3)
        assert float(torch.linalg.eigvalsh(K32.double()).min()) > -1e-4


def test_inputs_in_the_unit_square_are_not_shifted() -> None:
    """Inputs scaled to [-1, 1] (geodbk ingest's x1, x2) get the plain matmul form bit for bit,
    so that results on them do not change; far ones are shifted by their mean."""
    rng = np.random.default_rng(1)
    a = torch.as_tensor(rng.uniform(-1, 1, (30, 2)), dtype=torch.float32)
    b = torch.as_tensor(rng.uniform(-1, 1, (20, 2)), dtype=torch.float32)
    ls = torch.tensor([0.3, 0.5])
    an, bn = a / ls, b / ls
    plain = (an.pow(2).sum(-1, keepdim=True) + bn.pow(2).sum(-1) - 2.0 * an @ bn.T).clamp_min(0.0)
    assert torch.equal(scaled_sqdist(a, b, ls), plain)
    assert torch.equal(far_centre(b + torch.tensor([-157.0, 0.0]))[0, 1], torch.tensor(0.0))
