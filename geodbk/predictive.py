"""Predictive distributions: the :class:`Prediction` container and chunked evaluation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from scipy.stats import norm

from geodbk.bases import RBFInducingBasis
from geodbk.geo.contract import Z95
from geodbk.posterior import FoldedWeights

if TYPE_CHECKING:
    from geodbk.model import DBKModel

__all__ = [
    "Z95",
    "Prediction",
    "change_moments",
    "chunk_rows_for",
    "latent_change",
    "noise_kwargs",
    "predict_in_chunks",
]


@dataclass(frozen=True)
class Prediction:
    """Gaussian predictive distribution at n points (numpy float64, units of y).

    Attributes
    ----------
    mean
        Predictive mean ``mu(x)``.
    var
        Predictive variance of y, ``var_f(x) + s2`` (noise included).
    var_f
        Latent variance of f, ``var_f(x)``.
    """

    mean: np.ndarray
    var: np.ndarray
    var_f: np.ndarray

    @property
    def std(self) -> np.ndarray:
        """Predictive standard deviation ``sqrt(var)``."""
        return np.sqrt(self.var)

    @property
    def std_f(self) -> np.ndarray:
        """Latent standard deviation ``sqrt(var_f)``."""
        return np.sqrt(self.var_f)

    @property
    def noise_var(self) -> np.ndarray:
        """Noise variance ``var - var_f``."""
        return self.var - self.var_f

    @property
    def lower(self) -> np.ndarray:
        """Lower end of the 95% prediction interval, ``mean - z_{0.975} std``."""
        return self.mean - Z95 * self.std

    @property
    def upper(self) -> np.ndarray:
        """Upper end of the 95% prediction interval, ``mean + z_{0.975} std``."""
        return self.mean + Z95 * self.std

    def interval(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Central prediction interval ``mean ± Φ^{-1}((1+level)/2) std``."""
        z = float(norm.ppf(0.5 + 0.5 * level))
        return self.mean - z * self.std, self.mean + z * self.std

    def __len__(self) -> int:
        return int(self.mean.shape[0])


#: On the CPU, a chunk's widest intermediate (rows x ``width``) holds at most this many values,
#: so that it stays in cache: 2^21 floats (8 MB in float32) was the fastest of 2^19-2^24 for
#: r = 256 and r = 512 (docs/benchmarks/scaling.md, "Chunk size of a prediction").
CPU_CHUNK_VALUES = 1 << 21
#: Rows per chunk on the CPU at the least, whatever ``width``.
CPU_CHUNK_MIN_ROWS = 1024


def chunk_rows_for(chunk_size: int, *, device: torch.device | str, width: int | None = None) -> int:
    """Rows per prediction chunk: ``chunk_size``, and on the CPU with a ``width`` (values per
    row of the widest intermediate, e.g. the rank r) at most ``CPU_CHUNK_VALUES // width``
    (but at least ``CPU_CHUNK_MIN_ROWS``). A GPU takes ``chunk_size`` as it is."""
    if width is None or torch.device(device).type != "cpu":
        return chunk_size
    return min(chunk_size, max(CPU_CHUNK_MIN_ROWS, CPU_CHUNK_VALUES // max(width, 1)))


def predict_in_chunks(
    fn: Callable[[torch.Tensor], tuple[torch.Tensor, ...]],
    x: np.ndarray,
    *,
    chunk_size: int,
    device: torch.device,
    dtype: torch.dtype,
    width: int | None = None,
) -> tuple[np.ndarray, ...]:
    """Apply ``fn`` to ``x`` in chunks of at most ``chunk_size`` rows, under ``no_grad``.

    Only one chunk is on the device at a time; outputs are gathered as numpy float64 arrays
    (preallocated, so memory is O(n) for the outputs plus O(chunk_size r) for the work). With
    ``width`` (values per row of ``fn``'s widest intermediate) the chunk is capped on the CPU
    by :func:`chunk_rows_for`.

    Parameters
    ----------
    fn
        Maps a (b, d) tensor to a tuple of (b,) or (b, k) tensors.
    x
        Inputs, (n, d).
    chunk_size
        Maximum rows per chunk.
    device, dtype
        Where and in which precision ``fn`` runs.
    width
        Values per row of ``fn``'s widest intermediate (the rank r for a DBK prediction);
        ``None``: no cap.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    chunk_size = chunk_rows_for(chunk_size, device=device, width=width)
    n = x.shape[0]
    outputs: list[np.ndarray] | None = None
    with torch.no_grad():
        for start in range(0, max(n, 1), chunk_size):
            chunk = torch.as_tensor(x[start : start + chunk_size], dtype=dtype, device=device)
            results = fn(chunk)
            if outputs is None:
                outputs = [np.empty((n, *r.shape[1:]), dtype=np.float64) for r in results]
            for out, res in zip(outputs, results, strict=True):
                out[start : start + chunk.shape[0]] = res.detach().to("cpu", torch.float64).numpy()
    assert outputs is not None
    return tuple(outputs)


def change_moments(
    u_from: torch.Tensor,
    u_to: torch.Tensor,
    folded: FoldedWeights,
    *,
    prior_diff_var: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of the latent change ``f(b) - f(a)`` under the joint posterior of w.

    With raw features ``u`` and the folded weights ``a = P m``, ``B = P L`` (``phi = P'u``,
    :func:`geodbk.posterior.fold_into_basis`), ``f(x) = c + w'phi(x)`` and
    ``w ~ N(m, LL')``::

        E[f(b) - f(a)]   = a'(u_b - u_a)                     (the constant mean c cancels)
        Var[f(b) - f(a)] = ||B'(u_b - u_a)||^2
                           + max(0, d~(a, b) - ||W'(u_b - u_a)||^2)       (with a whitener W)

    where ``d~(a, b) = k~(a, a) + k~(b, b) - 2 k~(a, b)`` is the base kernel's prior variance of
    the difference (``prior_diff_var``). The second term is the residual (Nyström) process
    ``k~(x, x') - phi(x)'phi(x')`` of the variance-corrected objectives, whose diagonal is the
    correction :meth:`geodbk.model.DBKModel.predict_folded` adds to ``var_f``; so
    ``Var[f(b) - f(a)] = var_f(a) + var_f(b) - 2 cov(a, b)`` with the same posterior, and it is
    exactly 0 when ``a = b``.

    With a truncated factor ``B_k`` (``folded.variance_bound = lambda_{k+1} C``, ``C >=
    ||phi||^2``) the first term drops by ``sum_{j>k} lambda_j (v_j'(phi_b - phi_a))^2 <=
    lambda_{k+1} ||phi_b - phi_a||^2``: at most ``2 variance_bound`` for DBK-RBF
    (``||phi_b - phi_a||^2 <= d~(a, b) <= 2 sk2``, the Nyström kernel being dominated by
    ``k~``) and ``4 variance_bound`` in general.

    Parameters
    ----------
    u_from, u_to
        Raw features at ``a`` and ``b``, (n, r) each (row i of one pairs with row i of the other).
    folded
        The folded posterior weights.
    prior_diff_var
        ``d~(a, b)``, (n,); needed (and used) only when ``folded.whitener`` is set.

    Returns
    -------
    tuple of torch.Tensor
        ``(mean, var)``, each (n,), in standardised-target units.
    """
    du = u_to - u_from
    mean = du @ folded.mean_vec
    var = folded.latent_variance(du)
    if folded.whitener is not None:
        if prior_diff_var is None:
            raise ValueError("variance-corrected weights need prior_diff_var")
        resid = prior_diff_var - ((du @ folded.whitener) ** 2).sum(-1)
        var = var + resid.clamp_min(0.0)
    return mean, var


def latent_change(
    model: DBKModel, folded: FoldedWeights, x_from: torch.Tensor, x_to: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`change_moments` of ``model`` between inputs ``x_from`` and ``x_to`` (n, d) each.

    Runs the backbone on both, takes the basis' raw features and, for the variance-corrected
    RBF basis, ``d~(a, b) = 2 sk2 (1 - exp(-|g_a - g_b|_l^2 / 2))`` (the RBF-ARD base kernel on
    the backbone outputs ``g``).
    """

    basis = model.basis
    g_a = model.backbone(x_from)
    g_b = model.backbone(x_to)
    u_a = basis.raw_features(g_a)
    u_b = basis.raw_features(g_b)
    prior = None
    if folded.whitener is not None and isinstance(basis, RBFInducingBasis):
        d2 = (((g_b - g_a) * torch.exp(-basis.log_lengthscale)) ** 2).sum(-1)
        prior = 2.0 * basis.outputscale() * (-torch.expm1(-0.5 * d2))
    return change_moments(u_a, u_b, folded, prior_diff_var=prior)


def noise_kwargs(
    model: Any, tests: Any, devices: Any = None, *, urban: Any = None
) -> dict[str, Any]:
    """``predict_dist`` keywords of the rows' noise covariates that ``model`` uses.

    ``{}`` for a constant-noise model (or ``tests=None``), ``{"tests"}`` for a tests-aware
    one, plus ``{"devices"}`` for ``noise="tests+devices"`` when ``devices`` is given (else
    the model takes ``devices = tests``) and ``{"urban"}`` for a model with a floor per
    urban/rural class (``noise_urban``; it needs it).
    """
    kw: dict[str, Any] = {}
    if tests is not None and getattr(model, "tests_aware", False):
        kw["tests"] = tests
        if devices is not None and getattr(model, "devices_aware", False):
            kw["devices"] = devices
    if urban is not None and getattr(model, "noise_urban", False):
        kw["urban"] = urban
    return kw
