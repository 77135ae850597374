"""Training objectives as pure functions of model outputs, targets and hyperparameters.

Notation (methods §1): ``phi`` (b, r) basis functions, ``mean = m' phi + c`` the predictive mean,
``var_f = ||L' phi||^2`` the latent variance, ``phi_sq = ||phi||^2``, ``noise_var`` the noise
variance ``s2`` — a tensor broadcastable to the batch, so a per-point (heteroscedastic) variance
``s2_i`` can be passed in place of the scalar one. All losses are to be *minimised* and are
averaged per data point: over the rows given, or, with ``size=B``, summed over the rows given and
divided by ``B`` (one process's part of a global batch of ``B`` rows split over processes, see
:mod:`geodbk.distributed`; the parts then add up to the global batch's loss).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from geodbk.model import DBKModel, ModelOutput
    from geodbk.training import LoopConfig

__all__ = [
    "dppgp_loss",
    "elbo_loss",
    "exact_marginal_log_likelihood",
    "gaussian_kl_standard",
    "gaussian_nll",
    "ppgp_loss",
]

_LOG_2PI = math.log(2.0 * math.pi)


def gaussian_nll(y: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> torch.Tensor:
    """Per-point Gaussian negative log density.

    ``-log N(y; mean, var) = 1/2 (log 2π + log var + (y - mean)^2 / var)``.
    """
    return 0.5 * (_LOG_2PI + torch.log(var) + (y - mean) ** 2 / var)


def _batch_mean(values: torch.Tensor, size: int | None) -> torch.Tensor:
    """``mean(values)``, or ``sum(values) / size`` for a part of a batch of ``size`` points."""
    return values.mean() if size is None else values.sum() / size


def gaussian_kl_standard(mean: torch.Tensor, scale_tril: torch.Tensor) -> torch.Tensor:
    """``KL(N(m, LL') || N(0, I_r))``.

    ``KL = 1/2 (||m||^2 + ||L||_F^2 - 2 sum_i log L_ii - r)``. Under autograd, for one ``m``
    (r,) and ``L`` (r, r), its gradient ``dKL/dL = L - diag(1 / L_ii)`` is one pass over ``L``.

    Parameters
    ----------
    mean
        ``m``, shape (r,).
    scale_tril
        ``L``, lower triangular with positive diagonal, shape (r, r).
    """
    if torch.is_grad_enabled() and mean.dim() == 1 and scale_tril.dim() == 2:
        kl: torch.Tensor = _StandardKL.apply(mean, scale_tril)
        return kl
    r = mean.shape[-1]
    logdet = torch.log(torch.diagonal(scale_tril, dim1=-2, dim2=-1)).sum(-1)
    frobenius_sq = (scale_tril * scale_tril).sum((-2, -1))
    return 0.5 * ((mean**2).sum(-1) + frobenius_sq - 2.0 * logdet - r)


class _StandardKL(torch.autograd.Function):
    """:func:`gaussian_kl_standard` of one ``(m, L)`` with ``dKL/dm = m`` and
    ``dKL/dL = L - diag(1 / L_ii)`` written in one buffer (autograd's chain of the three terms
    makes five passes over ``L`` and a dense diagonal matrix)."""

    @staticmethod
    def forward(ctx: Any, mean: torch.Tensor, scale_tril: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(mean, scale_tril)
        with torch.no_grad():
            return gaussian_kl_standard(mean, scale_tril)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        mean, scale_tril = ctx.saved_tensors
        grad_mean = mean * grad if ctx.needs_input_grad[0] else None
        grad_tril = None
        if ctx.needs_input_grad[1]:
            grad_tril = scale_tril * grad
            grad_tril.diagonal().sub_(grad / torch.diagonal(scale_tril))
        return grad_mean, grad_tril


def dppgp_loss(
    mean: torch.Tensor,
    var_f: torch.Tensor,
    phi_sq: torch.Tensor,
    y: torch.Tensor,
    noise_var: torch.Tensor,
    *,
    kl: torch.Tensor,
    n: int,
    alpha: float,
    beta: float,
    phi_sq_max: torch.Tensor | None = None,
    size: int | None = None,
) -> torch.Tensor:
    """Decoupled predictive-process objective (dPPGP) for one mini-batch B.

    ``mean_B[-log N(y; mu, var_f + s2)] + α mean_B[(max_B ||phi||^2 - ||phi||^2) / (2 s2)]
    + (β / n) KL(q(w) || p(w))``.

    Parameters
    ----------
    mean, var_f, phi_sq
        ``mu(x)``, ``var_f(x)`` and ``||phi(x)||^2`` on the batch, shape (b,).
    y
        Targets, shape (b,).
    noise_var
        ``s2``, broadcastable to (b,).
    kl
        ``KL(q(w) || N(0, I))`` (see :func:`gaussian_kl_standard`).
    n
        Training-set size.
    alpha, beta
        Weights of the trace regulariser and of the KL term.
    phi_sq_max
        ``max_B ||phi||^2`` when the batch is split over processes (the maximum over the
        global batch, see :mod:`geodbk.distributed`); default ``phi_sq.max()``.
    size
        ``|B|`` when the rows given are a part of B (per-point terms summed, divided by
        ``size``; no rows give 0); default the number of rows given.
    """
    nll = _batch_mean(gaussian_nll(y, mean, var_f + noise_var), size)
    top = phi_sq.max() if phi_sq_max is None else phi_sq_max
    trace = _batch_mean((top - phi_sq) / (2.0 * noise_var), size)
    return nll + alpha * trace + (beta / n) * kl


def ppgp_loss(
    mean: torch.Tensor,
    var_f: torch.Tensor,
    y: torch.Tensor,
    noise_var: torch.Tensor,
    *,
    kl: torch.Tensor,
    n: int,
    beta: float,
    var_correction: torch.Tensor | None = None,
    size: int | None = None,
) -> torch.Tensor:
    """Parametric predictive GP objective (PPGP).

    ``mean_B[-log N(y; mu, var_f + δ + s2)] + (β / n) KL`` with the base-kernel variance
    correction ``δ(x) = k~(x, x) - ||phi(x)||^2`` (``var_correction``; ``None`` means 0).
    ``size``: ``|B|`` when the rows given are a part of B (see :func:`dppgp_loss`).
    """
    var = var_f if var_correction is None else var_f + var_correction
    return _batch_mean(gaussian_nll(y, mean, var + noise_var), size) + (beta / n) * kl


def elbo_loss(
    mean: torch.Tensor,
    var_f: torch.Tensor,
    y: torch.Tensor,
    noise_var: torch.Tensor,
    *,
    kl: torch.Tensor,
    n: int,
    var_correction: torch.Tensor | None = None,
    size: int | None = None,
) -> torch.Tensor:
    """Negative ELBO per point (SVGP; VBLL for a basis without correction).

    ``mean_B[-log N(y; mu, s2) + (var_f + δ) / (2 s2)] + KL / n``. ``size``: ``|B|`` when the
    rows given are a part of B (see :func:`dppgp_loss`).
    """
    var = var_f if var_correction is None else var_f + var_correction
    per_point = gaussian_nll(y, mean, noise_var) + var / (2.0 * noise_var)
    return _batch_mean(per_point, size) + kl / n


def exact_marginal_log_likelihood(
    phi: torch.Tensor,
    y: torch.Tensor,
    noise_var: torch.Tensor,
    *,
    mean: torch.Tensor | float = 0.0,
) -> torch.Tensor:
    """Exact log marginal likelihood ``log N(y; c, Phi Phi' + D)`` in O(n r^2).

    With ``D = diag(s2_i)``, ``Phi~ = D^{-1/2} Phi``, ``y~ = D^{-1/2} (y - c)`` and
    ``A = I_r + Phi~' Phi~ = L_A L_A'`` (Woodbury / matrix determinant lemma)::

        log p(y) = -n/2 log 2π - 1/2 sum_i log s2_i - 1/2 logdet A
                   - 1/2 ||y~||^2 + 1/2 ||L_A^{-1} Phi~' y~||^2.

    For a scalar ``s2`` this is the methods-doc form with ``Lambda = Phi'Phi + s2 I = s2 A``:
    ``-n/2 log 2π - (n-r)/2 log s2 - 1/2 logdet Lambda - ||y||^2/(2 s2)
    + ||chol(Lambda)^{-1} Phi'y||^2 / (2 s2)``.

    Parameters
    ----------
    phi
        Basis functions, (n, r).
    y
        Targets, (n,).
    noise_var
        ``s2``, broadcastable to (n,).
    mean
        Constant prior mean ``c``.

    Returns
    -------
    torch.Tensor
        ``log p(y)`` (0-d), the total over the n points (not averaged).
    """
    n, r = phi.shape
    d = torch.as_tensor(noise_var, dtype=phi.dtype, device=phi.device).expand(n)
    inv_sd = torch.rsqrt(d)
    phi_t = phi * inv_sd[:, None]
    y_t = (y - mean) * inv_sd
    a = phi_t.T @ phi_t + torch.eye(r, dtype=phi.dtype, device=phi.device)
    chol = torch.linalg.cholesky(a)
    proj = torch.linalg.solve_triangular(chol, (phi_t.T @ y_t)[:, None], upper=False)
    logdet_a = 2.0 * torch.log(torch.diagonal(chol)).sum()
    return (
        -0.5 * n * _LOG_2PI
        - 0.5 * torch.log(d).sum()
        - 0.5 * logdet_a
        - 0.5 * (y_t**2).sum()
        + 0.5 * (proj**2).sum()
    )


def batch_loss(
    model: DBKModel,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    n: int,
    config: LoopConfig,
    tests: torch.Tensor | None = None,
    out: ModelOutput | None = None,
    phi_sq_max: torch.Tensor | None = None,
    size: int | None = None,
    kl_share: float = 1.0,
) -> torch.Tensor:
    """The mini-batch loss of ``config.objective`` (not ``"exact"``) on ``(x, y)``.

    ``tests`` (b,), the noise covariate of the batch, gives the per-point noise
    ``s2_i = model.noise_var(tests)`` (ignored by the constant noise). ``out``: the model's
    output on ``x`` when already computed (e.g. through DDP). When the global batch B is split
    over W processes, each passes ``phi_sq_max`` (the maximum of ``||phi||^2`` over B, dPPGP),
    ``size = |B|`` and ``kl_share = 1 / W``; the W parts
    ``sum_{i in B_k} l_i / |B| + kl_share (β / n) KL`` then add up to the loss of B.
    """
    out = model(x) if out is None else out
    s2 = model.noise_var(tests)
    kl = gaussian_kl_standard(model.q.mean, out.scale_tril)
    if kl_share != 1.0:
        kl = kl_share * kl
    corr = out.var_correction if config.variance_correction else None
    if config.objective == "dppgp":
        return dppgp_loss(
            out.mean,
            out.var_f,
            out.phi_sq,
            y,
            s2,
            kl=kl,
            n=n,
            alpha=config.alpha,
            beta=config.beta,
            phi_sq_max=phi_sq_max,
            size=size,
        )
    if config.objective == "ppgp":
        return ppgp_loss(
            out.mean, out.var_f, y, s2, kl=kl, n=n, beta=config.beta, var_correction=corr, size=size
        )
    if config.objective == "elbo":
        return elbo_loss(out.mean, out.var_f, y, s2, kl=kl, n=n, var_correction=corr, size=size)
    raise ValueError(f"batch_loss does not handle objective {config.objective!r}")
