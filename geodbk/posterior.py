"""Posteriors over the basis weights w and their folding into the basis for fast prediction."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from geodbk.bases import RBFInducingBasis, SiLUBasis
from geodbk.triangular import block_width_for, lower_sq_norms

__all__ = [
    "MAX_RANK_FRACTION",
    "VARIANCE_RTOL",
    "FoldedWeights",
    "WeightPosterior",
    "accumulate_statistics",
    "exact_weight_posterior",
    "feature_sq_bound",
    "fold_into_basis",
    "lower_triangular_factor",
    "posterior_from_statistics",
    "truncate_variance_factor",
    "truncation_rank",
]

#: Default relative tolerance of the predictive variance ``var_f + s2`` for the truncated
#: variance factor (:func:`fold_into_basis`): the dropped latent variance is at most
#: ``VARIANCE_RTOL * min s2`` at every input.
VARIANCE_RTOL = 1e-3

#: The truncation is skipped when it would keep more than this fraction of the r eigenpairs.
MAX_RANK_FRACTION = 0.8

#: ``max_{|t| <= a} |SiLU(t)|`` is ``max(a sigmoid(a), -min SiLU)``; ``-min SiLU`` (at
#: ``t ~ -1.278``) is below this constant.
_SILU_NEG_MAX = 0.2785


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

    ``factor`` is a square ``C`` with ``C C' = B B'`` for ``B = P L`` (lower triangular when
    ``block_width > 0``), or, truncated, ``B_k = P V_k Lambda_k^{1/2}`` (r, k); then
    ``0 <= ||B'u||^2 - ||B_k'u||^2 <= variance_bound`` at every input (0 when exact).
    """

    mean_vec: torch.Tensor
    factor: torch.Tensor
    whitener: torch.Tensor | None = None
    variance_bound: float = 0.0
    block_width: int = 0

    @property
    def truncated(self) -> bool:
        """Whether ``factor`` keeps fewer columns than it has rows."""
        return int(self.factor.shape[1]) < int(self.factor.shape[0])

    def latent_variance(self, u: torch.Tensor) -> torch.Tensor:
        """``var_f = ||factor' u||^2`` for each row of ``u`` (n, r).

        With a lower-triangular factor (``block_width = w > 0``) the product runs over column
        blocks ``J = [s, s + w)`` and skips the zero rows above each:
        ``sum_J ||C[s:, J]' u[:, s:]||^2``, about ``(1 + w / r) / 2`` of the dense product's
        ``r^2`` multiply-adds per row.
        """
        return lower_sq_norms(u, self.factor, width=self.block_width)


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


def truncation_rank(eigenvalues: torch.Tensor, *, threshold: float) -> int:
    """Smallest ``k`` with ``lambda_{k+1} <= threshold`` (``lambda_{r+1} = 0``).

    ``eigenvalues`` are sorted in descending order; ``k`` is the number above ``threshold``.
    """
    return int((eigenvalues > threshold).sum())


def truncate_variance_factor(
    scale_tril: torch.Tensor,
    *,
    atol: float,
    feature_sq_bound: float,
    max_rank_fraction: float = MAX_RANK_FRACTION,
) -> tuple[torch.Tensor, float] | None:
    """Top-k eigen-factor of ``S = L L'`` whose dropped variance is at most ``atol``.

    With ``S = V Lambda V'`` (float64 ``eigh``, ``lambda_1 >= ... >= lambda_r``) and
    ``L_k = V_k Lambda_k^{1/2}`` (r, k), for every ``phi`` with ``||phi||^2 <= C``
    (``C = feature_sq_bound``)::

        0 <= ||L'phi||^2 - ||L_k'phi||^2 = sum_{j>k} lambda_j (v_j'phi)^2
                                          <= lambda_{k+1} ||phi||^2 <= lambda_{k+1} C.

    ``k`` is the smallest rank with ``lambda_{k+1} C <= atol`` (at least 1).

    Returns
    -------
    tuple or None
        ``(L_k, lambda_{k+1} C)`` with ``L_k`` in ``scale_tril``'s dtype, or ``None`` when
        ``k > max_rank_fraction r`` (no gain).
    """
    if atol <= 0.0 or not math.isfinite(feature_sq_bound) or feature_sq_bound <= 0.0:
        return None
    r = int(scale_tril.shape[0])
    lt = scale_tril.detach().to(torch.float64)
    cov = lt @ lt.T
    evals, evecs = torch.linalg.eigh(0.5 * (cov + cov.T))
    evals = evals.flip(0).clamp_min(0.0)
    evecs = evecs.flip(1)
    k = max(truncation_rank(evals, threshold=atol / feature_sq_bound), 1)
    if k > max_rank_fraction * r:
        return None
    dropped = float(evals[k]) if k < r else 0.0
    factor = evecs[:, :k] * evals[:k].sqrt()
    return factor.to(scale_tril.dtype), dropped * feature_sq_bound


def feature_sq_bound(
    basis: RBFInducingBasis | SiLUBasis, *, out_norm: nn.LayerNorm | None = None
) -> float | None:
    """An upper bound ``C >= ||phi(x)||^2`` valid for every input, or ``None``.

    DBK-RBF: ``||phi||^2 = k_Z'(Kzz + j sk2 I)^{-1} k_Z <= k~(x, x) = sk2`` (Nyström).
    DBK-SiLU after the backbone's ``g = SiLU(LayerNorm(z))`` (``out_norm``, weight ``gamma``,
    bias ``beta``): ``||g|| <= max|gamma| sqrt(h) + ||beta||`` (the normalised vector has
    squared norm ``<= h`` and ``|SiLU(t)| <= |t|``), so ``|W_i g + b_i| <= a_i = ||W_i|| ||g||
    + |b_i|`` and ``C = sum_i c_i^2 max(a_i sigmoid(a_i), 0.2785)^2``. Without ``out_norm``
    the SiLU basis has no bound (``None``).
    """
    if isinstance(basis, RBFInducingBasis):
        return float(basis.outputscale().detach())
    if out_norm is None:
        return None
    h = int(basis.hidden)
    gamma = out_norm.weight.detach().double() if out_norm.weight is not None else None
    beta = out_norm.bias.detach().double() if out_norm.bias is not None else None
    g_norm = math.sqrt(h) * (float(gamma.abs().max()) if gamma is not None else 1.0)
    if beta is not None:
        g_norm += float(beta.norm())
    w = basis.linear.weight.detach().double()
    b = basis.linear.bias.detach().double()
    a = w.norm(dim=1) * g_norm + b.abs()
    silu_max = torch.maximum(a * torch.sigmoid(a), torch.full_like(a, _SILU_NEG_MAX))
    c = basis.scale.detach().double()
    return float(((c * silu_max) ** 2).sum())


def fold_into_basis(
    basis: RBFInducingBasis | SiLUBasis,
    posterior: WeightPosterior,
    *,
    with_whitener: bool = False,
    variance_rtol: float = 0.0,
    min_noise_var: float | None = None,
    feature_bound: float | None = None,
    max_rank_fraction: float = MAX_RANK_FRACTION,
) -> FoldedWeights:
    """Fold the basis' fixed linear map into the weights once, at prediction time.

    DBK-RBF: ``phi = Lzz^{-1} k_Z``, so ``m'phi = (Lzz^{-T} m)' k_Z`` and
    ``||L'phi||^2 = ||(Lzz^{-T} L)' k_Z||^2`` (and ``||phi||^2 = ||Lzz^{-T}' k_Z||^2`` when
    ``with_whitener``). DBK-SiLU: nothing to fold. The exact factor is made lower triangular
    (:func:`lower_triangular_factor`, same ``B B'``), so that :meth:`FoldedWeights.latent_variance`
    skips its zero blocks.

    With ``variance_rtol > 0`` the variance factor is truncated
    (:func:`truncate_variance_factor`): ``L L' = V Lambda V'`` and ``factor = P V_k
    Lambda_k^{1/2}`` (r, k), so the latent variance drops by
    ``sum_{j>k} lambda_j (v_j'phi)^2 <= lambda_{k+1} ||phi||^2 <= lambda_{k+1} C`` with ``C``
    the bound on ``||phi||^2`` (``feature_bound``, default :func:`feature_sq_bound`: ``sk2``
    for DBK-RBF, none for DBK-SiLU). ``k`` is the smallest rank with
    ``lambda_{k+1} C <= variance_rtol * min_noise_var``, so the predictive variance
    ``var_f + s2`` (any ``s2 >= min_noise_var``) has relative error ``<= variance_rtol``
    everywhere; latent-only variances have that absolute error. The factor stays exact when
    no bound is known or ``k > max_rank_fraction r``. The mean is always exact.
    """
    mean_vec = basis.pullback(posterior.mean)
    factor: torch.Tensor | None = None
    bound = 0.0
    if variance_rtol > 0.0:
        if min_noise_var is None or not min_noise_var > 0.0:
            raise ValueError("variance_rtol > 0 needs a positive min_noise_var")
        c = feature_sq_bound(basis) if feature_bound is None else float(feature_bound)
        if c is not None:
            out = truncate_variance_factor(
                posterior.scale_tril,
                atol=variance_rtol * float(min_noise_var),
                feature_sq_bound=c,
                max_rank_fraction=max_rank_fraction,
            )
            if out is not None:
                factor = basis.pullback(out[0])
                bound = out[1]
    width = 0
    if factor is None:
        factor = lower_triangular_factor(basis.pullback(posterior.scale_tril))
        width = block_width_for(int(factor.shape[0]))
    whitener = None
    if with_whitener:
        r = posterior.mean.shape[0]
        eye = torch.eye(r, dtype=factor.dtype, device=factor.device)
        whitener = basis.pullback(eye)
    return FoldedWeights(
        mean_vec=mean_vec,
        factor=factor,
        whitener=whitener,
        variance_bound=bound,
        block_width=width,
    )


def lower_triangular_factor(factor: torch.Tensor) -> torch.Tensor:
    """A lower-triangular ``C`` with ``C C' = B B'`` for a square ``B``, in ``B``'s dtype.

    ``C = R'`` for the QR decomposition ``B' = Q R`` (float64): ``C C' = R'R = B Q'Q B' =
    B B'``. A ``B`` that is already lower triangular (DBK-SiLU's ``L``) is returned as is.
    """
    if not bool(torch.triu(factor, diagonal=1).any()):
        return factor
    upper = torch.linalg.qr(factor.detach().to(torch.float64).T, mode="r").R
    return upper.T.to(factor.dtype).contiguous()
