"""Kernels, positive parameters, Cholesky helpers and the Morton row order used by the baselines.

Everything here is a pure tensor function (no state) except :class:`Positive`, a tiny ``nn.Module`` for
positive scalars/vectors.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from geodbk.bases import stable_cholesky

#: Floor of every positive parameter (lengthscales, output scales, noise variances).
POSITIVE_FLOOR = 1e-6


def inv_softplus(value: float) -> float:
    """Inverse of ``softplus``: the raw value whose softplus is ``value`` (> 0)."""
    if value > 20.0:
        return value
    return math.log(math.expm1(value))


class Positive(nn.Module):
    """A positive parameter ``p = softplus(raw) + floor`` (scalar or vector).

    Parameters
    ----------
    init
        Initial value(s) of ``p`` (> floor).
    shape
        Shape of the parameter (``()`` for a scalar).
    floor
        Lower bound added after the softplus.
    """

    def __init__(self, init: float, *, shape: tuple[int, ...] = (), floor: float = POSITIVE_FLOOR):
        super().__init__()
        self.floor = float(floor)
        raw = inv_softplus(max(init - floor, 1e-12))
        self.raw = nn.Parameter(torch.full(shape, raw))

    def forward(self) -> Tensor:
        """Return ``softplus(raw) + floor``."""
        return F.softplus(self.raw) + self.floor


def far_centre(points: Tensor) -> Tensor:
    """The mean of ``points`` (rows) in each coordinate where it lies beyond ±1, else 0 (1, d),
    detached: the shift that keeps squared distances accurate far from the origin and leaves
    inputs scaled to [-1, 1] exactly as they are (no device synchronisation)."""
    centre = points.detach().mean(dim=-2, keepdim=True)
    return torch.where(centre.abs() > 1.0, centre, torch.zeros_like(centre))


def scaled_sqdist(a: Tensor, b: Tensor, lengthscale: Tensor) -> Tensor:
    """Squared distances Σ_j (a_ij - b_kj)² / l_j², clamped at 0 (matmul form, (n, m)).

    Both sets are first shifted by :func:`far_centre` of ``b`` (a constant: distances do not
    change), so that inputs far from the origin (raw lon/lat) do not cancel to rounding noise in
    float32.
    """
    centre = far_centre(b)
    a = (a - centre) / lengthscale
    b = (b - centre) / lengthscale
    d2 = (
        a.pow(2).sum(-1, keepdim=True)
        + b.pow(2).sum(-1).unsqueeze(-2)
        - 2.0 * a @ b.transpose(-1, -2)
    )
    return d2.clamp_min(0.0)


def rbf_ard(a: Tensor, b: Tensor, *, lengthscale: Tensor, outputscale: Tensor) -> Tensor:
    """RBF-ARD kernel k(a, b) = s · exp(-Σ_j (a_j - b_j)² / (2 l_j²))."""
    return outputscale * torch.exp(-0.5 * scaled_sqdist(a, b, lengthscale))


def matern32_ard(a: Tensor, b: Tensor, *, lengthscale: Tensor, outputscale: Tensor) -> Tensor:
    """Matérn-3/2 ARD kernel k(a, b) = s · (1 + √3 ρ) exp(-√3 ρ), ρ = ||(a - b) / l||.

    The distance is ``sqrt(max(ρ², 1e-12))`` so that the gradient at ρ = 0 stays finite.
    """
    rho = torch.sqrt(scaled_sqdist(a, b, lengthscale).clamp_min(1e-12))
    z = math.sqrt(3.0) * rho
    return outputscale * (1.0 + z) * torch.exp(-z)


def kernel_fn(name: str) -> Callable[..., Tensor]:
    """Return the kernel function called ``name`` (``"rbf"`` or ``"matern32"``)."""
    if name == "rbf":
        return rbf_ard
    if name == "matern32":
        return matern32_ard
    raise ValueError(f"unknown kernel {name!r}; use 'rbf' or 'matern32'")


def psd_cholesky(
    matrix: Tensor, *, jitter: float = 1e-6, max_tries: int = 5, scale: Tensor | float | None = None
) -> Tensor:
    """Cholesky factor of a symmetric PSD matrix with *relative* jitter ``jitter·scale·I``.

    Symmetrises, scales the jitter by ``scale`` (default: the mean diagonal; pass the kernel
    variance for matrices such as a conditional covariance whose diagonal can be ~0) and
    delegates to the core's :func:`geodbk.bases.stable_cholesky` (jitter ×10 per failed attempt,
    ``max_tries`` attempts).
    """
    sym = 0.5 * (matrix + matrix.transpose(-1, -2))
    if scale is None:
        scale = torch.diagonal(sym, dim1=-2, dim2=-1).mean()
    ref = float(torch.as_tensor(scale).detach().clamp_min(1e-12))
    return stable_cholesky(sym, jitter=jitter * ref, max_tries=max_tries)


def tri_solve(chol: Tensor, rhs: Tensor) -> Tensor:
    """Solve ``L X = rhs`` for lower-triangular ``L`` (forward substitution, no inverse)."""
    return torch.linalg.solve_triangular(chol, rhs, upper=False)


def morton_order(X: np.ndarray) -> np.ndarray:
    """Permutation that sorts the rows of ``X`` (n, d) along a Morton (Z-order) curve.

    Each column is quantised to ``⌊63 / d⌋`` bits over its own range (at most 21), the bits are
    interleaved (dimension 0 least significant within each bit level) and the codes are sorted
    stably, so ties keep the input order. Nearby tiles get nearby row indices, which makes the
    contiguous row blocks of CaGP's block-sparse actions spatially compact.
    """
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    bits = max(1, min(21, 63 // max(d, 1)))
    lo = X.min(axis=0)
    span = np.where(X.max(axis=0) > lo, X.max(axis=0) - lo, 1.0)
    q = np.floor((X - lo) / span * (2**bits - 1)).astype(np.uint64)
    code = np.zeros(n, dtype=np.uint64)
    for bit in range(bits):
        for j in range(d):
            code |= ((q[:, j] >> np.uint64(bit)) & np.uint64(1)) << np.uint64(bit * d + j)
    return np.argsort(code, kind="stable")
