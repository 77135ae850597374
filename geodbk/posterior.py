"""Posteriors over the basis weights w and their folding into the basis for fast prediction."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from geodbk.bases import RBFInducingBasis, SiLUBasis

__all__ = [
    "FoldedWeights",
    "WeightPosterior",
    "accumulate_statistics",
    "exact_weight_posterior",
    "fold_into_basis",
    "posterior_from_statistics",
]


@dataclass(frozen=True)
class WeightPosterior:
    """Gaussian over w: ``N(mean, scale_tril scale_tril')`` (``scale_tril`` lower, diag > 0)."""

    mean: torch.Tensor
    scale_tril: torch.Tensor


@dataclass(frozen=True)
class FoldedWeights:
    """Weights folded into the raw basis features ``u(x)`` (``k_Z(g(x))`` for DBK-RBF).

    ``mu(x) = u(x)' mean_vec + bias``, ``var_f(x) = ||factor' u(x)||^2`` and, when
    ``whitener`` is set, ``||phi(x)||^2 = ||whitener' u(x)||^2``.
    """

    mean_vec: torch.Tensor
    factor: torch.Tensor
    whitener: torch.Tensor | None = None


def accumulate_statistics(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    *,
    mean: torch.Tensor | float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sufficient statistics ``(Phi~'Phi~, Phi~'y~)`` accumulated over chunks of data.

    ``Phi~ = D^{-1/2} Phi``, ``y~ = D^{-1/2} (y - c)``. Memory O(r^2) whatever n is.

    Parameters
    ----------
    batches
        Iterable of ``(phi, y, noise_var)`` with ``phi`` (b, r), ``y`` (b,), ``noise_var``
        broadcastable to (b,).
    mean
        Constant prior mean ``c``.
    """
    gram: torch.Tensor | None = None
    proj: torch.Tensor | None = None
    for phi, y, noise_var in batches:
        d = torch.as_tensor(noise_var, dtype=phi.dtype, device=phi.device).expand(phi.shape[0])
        inv_sd = torch.rsqrt(d)
        phi_t = phi * inv_sd[:, None]
        y_t = (y - mean) * inv_sd
        g = phi_t.T @ phi_t
        p = phi_t.T @ y_t
        gram = g if gram is None else gram + g
        proj = p if proj is None else proj + p
    if gram is None or proj is None:
        raise ValueError("accumulate_statistics needs at least one batch")
    return gram, proj


def posterior_from_statistics(gram: torch.Tensor, proj: torch.Tensor) -> WeightPosterior:
    """Exact posterior of w from ``(Phi~'Phi~, Phi~'y~)``.

    With ``A = I_r + Phi~'Phi~``: ``w | y ~ N(A^{-1} Phi~'y~, A^{-1})``; for scalar noise this is
    ``N(Lambda^{-1} Phi'y, s2 Lambda^{-1})`` with ``Lambda = Phi'Phi + s2 I``.

    The lower Cholesky factor of ``A^{-1}`` is ``P C^{-T} P`` where ``P`` reverses the order and
    ``P A P = C C'`` (triangular solves only, no explicit inverse of ``A``).
    """
    r = gram.shape[0]
    eye = torch.eye(r, dtype=gram.dtype, device=gram.device)
    a = gram + eye
    chol_a = torch.linalg.cholesky(a)
    mean = torch.cholesky_solve(proj[:, None], chol_a).squeeze(-1)
    c = torch.linalg.cholesky(a.flip(0, 1))
    c_inv = torch.linalg.solve_triangular(c, eye, upper=False)
    scale_tril = c_inv.T.flip(0, 1)
    return WeightPosterior(mean=mean, scale_tril=scale_tril)


def exact_weight_posterior(
    phi: torch.Tensor,
    y: torch.Tensor,
    noise_var: torch.Tensor,
    *,
    mean: torch.Tensor | float = 0.0,
) -> WeightPosterior:
    """Exact posterior ``p(w | y)`` for ``y = c + Phi w + eps``, ``w ~ N(0, I)``, ``eps ~ N(0, D)``.

    ``w | y ~ N(A^{-1} Phi'D^{-1}(y - c), A^{-1})``, ``A = I + Phi'D^{-1}Phi``
    (scalar noise: ``N(Lambda^{-1} Phi'(y - c), s2 Lambda^{-1})``). Cost O(n r^2).
    """
    gram, proj = accumulate_statistics([(phi, y, noise_var)], mean=mean)
    return posterior_from_statistics(gram, proj)


def fold_into_basis(
    basis: RBFInducingBasis | SiLUBasis,
    posterior: WeightPosterior,
    *,
    with_whitener: bool = False,
) -> FoldedWeights:
    """Fold the basis' fixed linear map into the weights once, at prediction time.

    DBK-RBF: ``phi = Lzz^{-1} k_Z``, so ``m'phi = (Lzz^{-T} m)' k_Z`` and
    ``||L'phi||^2 = ||(Lzz^{-T} L)' k_Z||^2`` (and ``||phi||^2 = ||Lzz^{-T}' k_Z||^2`` when
    ``with_whitener``). DBK-SiLU: nothing to fold.
    """
    mean_vec = basis.pullback(posterior.mean)
    factor = basis.pullback(posterior.scale_tril)
    whitener = None
    if with_whitener:
        r = posterior.mean.shape[0]
        eye = torch.eye(r, dtype=factor.dtype, device=factor.device)
        whitener = basis.pullback(eye)
    return FoldedWeights(mean_vec=mean_vec, factor=factor, whitener=whitener)
