"""Basis expansions phi: R^h -> R^r on top of the backbone output g(x).

Every basis exposes

* ``forward(g)`` — the basis functions ``phi(g)``, shape (b, r);
* ``raw_features(g)`` and ``pullback(M)`` with ``phi(g)' M = raw_features(g)' pullback(M)``, so a
  fixed matrix can be folded into the basis once at prediction time;
* ``prior_variance(g)`` — the base-kernel variance ``k~(x, x)`` (inducing-point bases) or ``None``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["RBFInducingBasis", "SiLUBasis", "stable_cholesky"]


def stable_cholesky(matrix: torch.Tensor, *, jitter: float, max_tries: int = 5) -> torch.Tensor:
    """Lower Cholesky factor of ``matrix + jitter I``, growing the jitter tenfold on failure.

    Parameters
    ----------
    matrix
        Symmetric positive semi-definite matrix (r, r).
    jitter
        Initial diagonal jitter (absolute).
    max_tries
        Number of attempts (jitter, 10 jitter, ...).

    Raises
    ------
    torch.linalg.LinAlgError
        When no attempt succeeds (non-finite entries or a badly indefinite matrix).
    """
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    jit = float(jitter)
    for _ in range(max_tries):
        chol, info = torch.linalg.cholesky_ex(matrix + jit * eye)
        if int(info.max()) == 0:
            return chol
        jit *= 10.0
    raise torch.linalg.LinAlgError(
        f"Cholesky failed with jitter up to {jit / 10:g}; the matrix may contain NaN/Inf"
    )


class RBFInducingBasis(nn.Module):
    """Whitened RBF-ARD inducing-point basis (DBK-RBF, the sparse-DKL basis).

    ``phi(g) = Lzz^{-1} k_Z(g)`` with ``Lzz = chol(Kzz + j sk2 I)`` (a triangular solve, never an
    explicit inverse) and the base kernel
    ``k~(a, b) = sk2 exp(-sum_j (a_j - b_j)^2 / (2 l_j^2))``.
    Then ``phi(x)'phi(x') = k_Z(x)' (Kzz + jI)^{-1} k_Z(x')`` (Nyström) and
    ``||phi(x)||^2 <= k~(x, x) = sk2``.

    Parameters
    ----------
    hidden
        Latent dimension ``h``.
    rank
        Number of inducing points ``r``.
    jitter
        Relative jitter ``j`` (multiplied by ``sk2``) added to ``Kzz`` before the Cholesky.
    generator
        Optional generator for the ``U[-1, 1]^h`` inducing-point initialisation.
    """

    def __init__(
        self,
        hidden: int,
        rank: int,
        *,
        jitter: float = 1e-4,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.hidden = int(hidden)
        self.rank = int(rank)
        self.jitter = float(jitter)
        self.inducing = nn.Parameter(torch.rand(rank, hidden, generator=generator) * 2.0 - 1.0)
        self.log_lengthscale = nn.Parameter(torch.full((hidden,), 0.5 * math.log(hidden)))
        self.log_outputscale = nn.Parameter(torch.zeros(()))

    def outputscale(self) -> torch.Tensor:
        """The base-kernel variance ``sk2`` (0-d)."""
        return self.log_outputscale.exp()

    def _sqdist(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        inv_l = torch.exp(-self.log_lengthscale)
        a = a * inv_l
        b = b * inv_l
        d2 = (a * a).sum(-1, keepdim=True) - 2.0 * a @ b.T + (b * b).sum(-1)
        return d2.clamp_min(0.0)

    def cross(self, g: torch.Tensor) -> torch.Tensor:
        """``k_Z(g)``: the base kernel between ``g`` (b, h) and the inducing points, (b, r).

        In log space, one fused product: ``log k = log sk2 + a'z - ||a||²/2 - ||z||²/2`` with
        ``a = g / l``, ``z = Z / l``, capped at ``log sk2`` (the squared distance is >= 0).
        """
        inv_l = torch.exp(-self.log_lengthscale)
        a = g * inv_l
        z = self.inducing * inv_l
        bias = self.log_outputscale - 0.5 * (z * z).sum(-1)
        logits = torch.addmm(bias, a, z.T)
        half_sq = 0.5 * (a * a).sum(-1, keepdim=True)
        if torch.is_grad_enabled() and logits.requires_grad:
            return torch.exp(torch.clamp(logits - half_sq, max=self.log_outputscale))
        return logits.sub_(half_sq).clamp_(max=float(self.log_outputscale)).exp_()

    def chol(self) -> torch.Tensor:
        """``Lzz = chol(Kzz + j sk2 I)``, lower triangular (r, r)."""
        kzz = self.outputscale() * torch.exp(-0.5 * self._sqdist(self.inducing, self.inducing))
        kzz = 0.5 * (kzz + kzz.T)
        return stable_cholesky(kzz, jitter=self.jitter * float(self.outputscale().detach()))

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        """``phi(g) = Lzz^{-1} k_Z(g)``, shape (b, r)."""
        kz = self.cross(g)
        return torch.linalg.solve_triangular(self.chol(), kz.T, upper=False).T

    def raw_features(self, g: torch.Tensor) -> torch.Tensor:
        """``k_Z(g)``; ``phi(g)' M = k_Z(g)' Lzz^{-T} M``."""
        return self.cross(g)

    def pullback(self, matrix: torch.Tensor) -> torch.Tensor:
        """``Lzz^{-T} M`` for ``M`` of shape (r,) or (r, k) (triangular solve)."""
        mat = matrix.unsqueeze(-1) if matrix.dim() == 1 else matrix
        out = torch.linalg.solve_triangular(self.chol().T, mat, upper=True)
        return out.squeeze(-1) if matrix.dim() == 1 else out

    def prior_variance(self, g: torch.Tensor) -> torch.Tensor | None:
        """``k~(x, x) = sk2`` for every row of ``g``, shape (b,)."""
        return self.outputscale().expand(g.shape[0])


class SiLUBasis(nn.Module):
    """Bayesian-last-layer basis (DBK-SiLU): ``phi(g) = diag(c) SiLU(W g + b)``.

    ``c`` is initialised to random signs divided by ``sqrt(r)``.

    Parameters
    ----------
    hidden
        Latent dimension ``h``.
    rank
        Number of basis functions ``r``.
    generator
        Optional generator for the sign initialisation of ``c``.
    """

    def __init__(self, hidden: int, rank: int, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.hidden = int(hidden)
        self.rank = int(rank)
        self.linear = nn.Linear(hidden, rank)
        signs = torch.randint(0, 2, (rank,), generator=generator).to(torch.get_default_dtype())
        self.scale = nn.Parameter((2.0 * signs - 1.0) / math.sqrt(rank))

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        """``phi(g) = c * SiLU(W g + b)``, shape (b, r)."""
        return self.scale * torch.nn.functional.silu(self.linear(g))

    def raw_features(self, g: torch.Tensor) -> torch.Tensor:
        """``phi(g)`` itself (nothing to fold)."""
        return self.forward(g)

    def pullback(self, matrix: torch.Tensor) -> torch.Tensor:
        """Identity: ``phi(g)' M`` needs no folding."""
        return matrix

    def prior_variance(self, g: torch.Tensor) -> torch.Tensor | None:
        """``None``: the SiLU basis has no base kernel."""
        return None
