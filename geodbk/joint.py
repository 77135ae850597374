"""Joint posterior samples of a fitted DBK model at many places, from shared weight draws.

The DBK latent function is linear in its weights, ``f(x) = c + w' phi(x)`` with
``q(w) = N(m, LL')``. With the folded weights (:func:`geodbk.posterior.fold_into_basis`:
``phi = P'u``, ``a = P m``, ``B = P L``, ``u`` the basis' raw features) and one standard normal
matrix ``eps`` (r, S) of weight draws ``w_s = m + L eps_s``, every place gets, in y's units,

.. math::

    f_s(x) = \\mu(x) + y_{sd}\\, u(x)' B \\varepsilon_s, \\qquad
    \\mu(x) = y_{mean} + y_{sd} (u(x)' a + c),

so ``Cov[f(x), f(x')] = y_sd² u(x)' B B' u(x')`` is kept exactly between any places that share
``eps``: a chunk of cells and the next one, or the cells of a county and its tiles. Weight
draws cost one ``(r, r) @ (r, S)`` product once (``B eps``); a place then costs one backbone
pass and one ``(r,) @ (r, S)`` product. The variance-corrected objectives (PPGP/ELBO with the RBF
basis, whose folded weights carry a whitener ``W``) add the Nyström residual process
``k~(x, x') - phi(x)'phi(x')``; only its diagonal ``y_sd² max(0, k~(x, x) - ||W'u(x)||²)`` is
returned, and it is drawn independently per place (:func:`quantity_draws`).

:func:`quantity_draws` turns latent draws into draws of the ``area``, ``tile`` or ``test``
quantity (:mod:`geodbk.quantities`): the GP's whole error enters the tile level, correlated
across places through the shared weight draws, as far as the place's variance allows (less
where a tile's own history has shrunk it), and the rest of the quantity's variance is drawn
independently per place and sample. That drops the correlation between nearby tiles of the
local layer's short-range field and of the tile offsets that the neighbours' pull shares: an
approximation, stated in ``docs/decisions/area_summaries.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from geodbk.predictive import predict_in_chunks

if TYPE_CHECKING:
    from geodbk.estimator import DBKRegressor
    from geodbk.model import DBKModel
    from geodbk.posterior import FoldedWeights
    from geodbk.quantities import QuantityPrediction

__all__ = [
    "JointSampler",
    "LatentDraws",
    "quantity_draws",
    "quantity_parts",
    "standard_normal_weights",
]


@dataclass(frozen=True)
class LatentDraws:
    """Joint draws of the latent f at n places (numpy float64, y's units).

    Attributes
    ----------
    mean
        Posterior mean ``mu(x)``, (n,).
    deviations
        Correlated deviations ``f_s(x) - mu(x) = y_sd u(x)' B eps_s``, (n, S); their variance
        over ``eps`` is ``y_sd² ||B'u(x)||² = var_f(x) - residual_var`` (``var_f`` of
        :meth:`DBKRegressor.predict_dist`).
    residual_var
        Variance of the independent residual process at each place, ``y_sd² max(0, k~(x, x)
        - ||W'u(x)||²)`` for the variance-corrected objectives, else 0; (n,).
    """

    mean: np.ndarray
    deviations: np.ndarray
    residual_var: np.ndarray

    def __len__(self) -> int:
        return int(self.mean.shape[0])


def standard_normal_weights(rank: int, samples: int, *, rng: np.random.Generator) -> np.ndarray:
    """``eps`` (rank, samples) of independent standard normals: ``w_s = m + L eps_s``."""
    if samples < 1 or rank < 1:
        raise ValueError(f"rank and samples must be positive, got {rank}, {samples}")
    return rng.standard_normal((int(rank), int(samples)))


def _chunk_draws(
    model: DBKModel, folded: FoldedWeights, x: torch.Tensor, weight_draws: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(u'a + c, u' (B eps), residual)`` on a batch, in standardised units."""
    g = model.backbone(x)
    u = model.basis.raw_features(g)
    mean = u @ folded.mean_vec + model.const_mean
    dev = u @ weight_draws
    if folded.whitener is None:
        resid = torch.zeros_like(mean)
    else:
        prior = model.basis.prior_variance(g)
        assert prior is not None
        resid = (prior - ((u @ folded.whitener) ** 2).sum(-1)).clamp_min(0.0)
    return mean, dev, resid


class JointSampler:
    """Joint posterior draws of a fitted :class:`~geodbk.estimator.DBKRegressor`'s latent f
    from fixed weight draws ``eps`` (r, S), shared by every call of :meth:`draws`.

    Parameters
    ----------
    model
        A fitted ``DBKRegressor``.
    eps
        Standard normal weight draws (r, S) (:func:`standard_normal_weights`); column s is
        the s-th joint sample everywhere.

    Notes
    -----
    The draws use the estimator's folded factor, so their covariance matches the ``var_f``
    of :meth:`~geodbk.estimator.DBKRegressor.predict_dist` exactly. When that factor is
    truncated (``B_k = P V_k Lambda_k^{1/2}``, (r, k), :func:`geodbk.posterior.fold_into_basis`)
    only the first k rows of ``eps`` are used, ``w_s = m + V_k Lambda_k^{1/2} eps_s[:k]``, and
    ``Cov = y_sd² u'B_k B_k'u'`` differs from the exact one by at most the fold's
    ``variance_bound`` (times ``y_sd²``) on the diagonal; the per-place cost (one
    ``(r,) @ (r, S)`` product) is the same either way.
    """

    def __init__(self, model: DBKRegressor, eps: Any) -> None:
        self.model = model
        core = model._check_fitted()
        self._core = core
        self._folded = model._folded_weights()
        e = np.asarray(eps, dtype=np.float64)
        if e.ndim != 2 or e.shape[0] != core.rank:
            raise ValueError(f"eps must be (rank={core.rank}, S), got shape {e.shape}")
        factor = self._folded.factor
        k = int(factor.shape[1])
        with torch.no_grad():
            self._weights = factor @ torch.as_tensor(
                e[:k], dtype=factor.dtype, device=factor.device
            )
        self.samples = int(e.shape[1])

    def draws(self, X: Any, *, chunk_size: int = 8192) -> LatentDraws:
        """:class:`LatentDraws` at inputs ``X`` (n, d), evaluated ``chunk_size`` rows at a
        time (memory O(chunk_size (r + S)) on the device plus the (n, S) output)."""
        m = self.model
        x_np = m._check_input(X)
        mean, dev, resid = predict_in_chunks(
            lambda xb: _chunk_draws(self._core, self._folded, xb, self._weights),
            x_np,
            chunk_size=chunk_size,
            device=m.device_,
            dtype=self._weights.dtype,
        )
        sd = float(m.y_std_)
        return LatentDraws(
            mean=float(m.y_mean_) + sd * mean,
            deviations=sd * dev.reshape(x_np.shape[0], self.samples),
            residual_var=sd**2 * resid,
        )


def quantity_parts(pred: QuantityPrediction, residual_var: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(a, v_ind)``: the scale of the correlated latent deviations in the quantity and the
    independent variance per place, so that ``q_s = mean + a dev_s + sqrt(v_ind) z_s`` has
    the quantity's variance ``pred.var`` at every place.

    With ``v_c = var_f - residual_var`` the correlated (weight-space) part of the GP's
    variance: ``area``: ``a = 1`` (``v_ind`` is the residual process); ``tile``/``test``:
    ``a² = min(1, var / v_c)`` (the GP's whole error, less where the tile's own history
    shrinks the tile variance below ``v_c``) and ``v_ind = var - a² v_c >= 0``: the tile
    offset, the local layer's field, the residual process and, for ``test``, the noise. The
    tile effect's ``lambda`` (the share of ``v_c`` its rows show) is not used: it is fitted on
    single rows, which cannot tell an error shared across the region from a tile's own, and
    with it (about 0.01 on pooled Hawaii models) area shares came out surer than the GP is.
    """
    var = np.asarray(pred.var, dtype=np.float64)
    v_c = np.maximum(np.asarray(pred.area_var, dtype=np.float64) - residual_var, 0.0)
    if pred.quantity == "area":
        a2 = np.ones_like(var)
    else:
        ratio = np.divide(var, v_c, out=np.ones_like(var), where=v_c > 0)
        a2 = np.minimum(1.0, ratio)
    ind = np.maximum(var - a2 * v_c, 0.0)
    return np.sqrt(a2), ind


def quantity_draws(
    pred: QuantityPrediction,
    latent: LatentDraws,
    *,
    rng: np.random.Generator,
) -> np.ndarray:
    """Joint draws (n, S) of ``pred``'s quantity: ``mean + a dev + sqrt(v_ind) z`` with
    ``(a, v_ind)`` of :func:`quantity_parts` and ``z`` (n, S) independent standard normals
    from ``rng`` (one per place and sample)."""
    a, ind = quantity_parts(pred, latent.residual_var)
    out = latent.deviations * a[:, None]
    out += np.sqrt(ind)[:, None] * rng.standard_normal(out.shape)
    out += np.asarray(pred.mean, dtype=np.float64)[:, None]
    return out
