"""Variational weights q(w) = N(m, L L') over the r basis coefficients."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

__all__ = ["VariationalWeights"]


def _scale_tril(lower: torch.Tensor, diagonal: torch.Tensor) -> torch.Tensor:
    """``tril(lower, -1)`` with ``diagonal`` written on its diagonal."""
    out = torch.tril(lower, diagonal=-1)
    out.diagonal().copy_(diagonal)
    return out


class _ScaleTril(torch.autograd.Function):
    """``L = tril(A, -1) + diag(exp(s))`` with one pass for its backward: ``dl/dA = tril(G, -1)``,
    ``dl/ds = diag(G) exp(s)``."""

    @staticmethod
    def forward(ctx: Any, lower: torch.Tensor, log_diag: torch.Tensor) -> torch.Tensor:
        diagonal = log_diag.exp()
        ctx.save_for_backward(diagonal)
        return _scale_tril(lower, diagonal)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (diagonal,) = ctx.saved_tensors
        return torch.tril(grad, diagonal=-1), grad.diagonal() * diagonal


class VariationalWeights(nn.Module):
    """Full-covariance Gaussian ``q(w) = N(m, L L')`` with ``L`` lower triangular.

    ``L = tril(A, -1) + diag(exp(s))``: the diagonal is stored as its logarithm (positive by
    construction) and only the strict lower triangle of ``A`` is used.

    Initialisation (methods §1): ``m = 0``, ``s = -0.5 log r`` (so ``diag L = 1/sqrt(r)``),
    ``A ~ N(0, 1) / r``.

    Parameters
    ----------
    rank
        Number of basis functions ``r``.
    generator
        Optional generator for the random strict-lower initialisation.
    """

    def __init__(self, rank: int, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.rank = int(rank)
        self.mean = nn.Parameter(torch.zeros(rank))
        self.log_diag = nn.Parameter(torch.full((rank,), -0.5 * math.log(rank)))
        self.lower = nn.Parameter(torch.randn(rank, rank, generator=generator) / rank)

    def scale_tril(self) -> torch.Tensor:
        """``L = tril(A, -1) + diag(exp(s))``, shape (r, r): the diagonal written into the
        strict lower triangle's zeros (no r x r diagonal matrix, no r x r sum)."""
        if torch.is_grad_enabled():
            out: torch.Tensor = _ScaleTril.apply(self.lower, self.log_diag)
            return out
        return _scale_tril(self.lower, self.log_diag.exp())

    @torch.no_grad()
    def set_(self, mean: torch.Tensor, scale_tril: torch.Tensor) -> None:
        """Set ``q(w)`` to ``N(mean, scale_tril scale_tril')`` (``scale_tril`` lower, diag > 0)."""
        diag = torch.diagonal(scale_tril)
        if bool((diag <= 0).any()):
            raise ValueError("scale_tril must have a positive diagonal")
        self.mean.copy_(mean)
        self.log_diag.copy_(diag.log())
        self.lower.copy_(torch.tril(scale_tril, diagonal=-1))
