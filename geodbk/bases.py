"""Basis expansions phi: R^h -> R^r on top of the backbone output g(x).

Every basis exposes

* ``forward(g)`` — the basis functions ``phi(g)``, shape (b, r);
* ``raw_features(g)`` and ``pullback(M)`` with ``phi(g)' M = raw_features(g)' pullback(M)``, so a
  fixed matrix can be folded into the basis once at prediction time;
* ``prior_variance(g)`` — the base-kernel variance ``k~(x, x)`` (inducing-point bases) or ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from geodbk.triangular import block_width_for, lower_gram

__all__ = ["RBFInducingBasis", "SiLUBasis", "scaled_rbf", "stable_cholesky"]


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
    jit = float(jitter)
    for _ in range(max_tries):
        jittered = matrix.clone()
        jittered.diagonal(dim1=-2, dim2=-1).add_(jit)
        chol, info = torch.linalg.cholesky_ex(jittered)
        if int(info.max()) == 0:
            return chol
        jit *= 10.0
    raise torch.linalg.LinAlgError(
        f"Cholesky failed with jitter up to {jit / 10:g}; the matrix may contain NaN/Inf"
    )


def scaled_rbf(a: torch.Tensor, b: torch.Tensor, log_sk2: torch.Tensor) -> torch.Tensor:
    """``sk2 exp(-||a_i - b_j||² / 2)`` for rows of ``a`` (n, h) and ``b`` (m, h), (n, m).

    In log space, one fused product: ``log sk2 + a_i'b_j - ||a_i||²/2 - ||b_j||²/2``, capped at
    ``log sk2`` (the squared distance is >= 0; a tensor bound, so no device sync), exponentiated
    in place.
    """
    bias = log_sk2 - 0.5 * (b * b).sum(-1)
    logits = torch.addmm(bias, a, b.T)
    logits.sub_(0.5 * (a * a).sum(-1, keepdim=True)).clamp_(max=log_sk2.detach())
    return logits.exp_()


class _ScaledRBF(torch.autograd.Function):
    """:func:`scaled_rbf` with its gradients from ``W = G * K`` (``G`` the incoming gradient):
    ``dl/da = W b - diag(W 1) a``, ``dl/db = W' a - diag(W' 1) b``, ``dl/dlog sk2 = 1'W 1``,
    the derivatives of ``log k = log sk2 + a'b - ||a||²/2 - ||b||²/2``. Where rounding made the
    squared distance negative and the cap applies, the distance is zero and these are its
    derivatives too.
    """

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, log_sk2: torch.Tensor) -> torch.Tensor:
        kernel = scaled_rbf(a, b, log_sk2)
        ctx.save_for_backward(a, b, kernel)
        return kernel

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        a, b, kernel = ctx.saved_tensors
        weights = grad * kernel
        row = weights.sum(1)
        col = weights.sum(0)
        grad_a = weights @ b - row[:, None] * a if ctx.needs_input_grad[0] else None
        grad_b = weights.T @ a - col[:, None] * b if ctx.needs_input_grad[1] else None
        grad_sk2 = row.sum() if ctx.needs_input_grad[2] else None
        return grad_a, grad_b, grad_sk2


#: Up to this rank the CPU's ``L^{-T} D' L^{-1}`` takes both solves from the right
#: (:func:`_sandwich`; ``benchmarks/bench_whiten_solves.py``).
RIGHT_SOLVES_MAX_RANK = 768


def _sandwich(chol: torch.Tensor, lower: torch.Tensor) -> torch.Tensor:
    """``L^{-T} D' L^{-1}`` for lower-triangular ``L`` (``chol``) and ``D`` (``lower``), by two
    triangular solves: ``half = L^{-T} D'`` and then ``half L^{-1}``. On the CPU up to
    :data:`RIGHT_SOLVES_MAX_RANK` the first is taken as ``(D L^{-1})'``, a solve from the
    right, which the CPU's BLAS runs faster there than the solve from the left (slower at
    r = 1024)."""
    if chol.device.type == "cpu" and int(chol.shape[-1]) <= RIGHT_SOLVES_MAX_RANK:
        half = torch.linalg.solve_triangular(chol, lower, upper=False, left=False).mT
    else:
        half = torch.linalg.solve_triangular(chol.T, lower.mT, upper=True)
    return torch.linalg.solve_triangular(chol, half, upper=False, left=False)


class _Whiten(torch.autograd.Function):
    """``phi = k_Z Lzz^{-T}`` with ``Lzz = chol(Kzz + j I)``, and the gradients of both inputs in
    one backward.

    With ``G = dl/dphi``: ``dl/dk_Z = G Lzz^{-1}``. Through the Cholesky factor,
    ``dl/dLzz = -tril(Lzz^{-T} G' phi)``, so ``tril(Lzz' dl/dLzz) = -T`` with
    ``T = tril(G' phi)``, and the gradient of the symmetric ``Kzz`` is the symmetric part of
    ``-Lzz^{-T} D' Lzz^{-1}``, ``D`` being ``T`` with its diagonal halved. That matrix is
    returned: ``Kzz`` must be symmetric by construction (its perturbations are), which makes
    the symmetric part all that counts. Autograd's chain (the solve's backward, then the
    Cholesky's) computes the symmetric form with one more r x r x r product.
    """

    @staticmethod
    def forward(ctx: Any, cross: torch.Tensor, kzz: torch.Tensor, jitter: float) -> torch.Tensor:
        chol = stable_cholesky(kzz, jitter=jitter)
        phi = torch.linalg.solve_triangular(chol.T, cross, upper=True, left=False)
        ctx.save_for_backward(chol, phi)
        return phi

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        chol, phi = ctx.saved_tensors
        grad_cross = grad_kzz = None
        if ctx.needs_input_grad[0]:
            grad_cross = torch.linalg.solve_triangular(chol, grad, upper=False, left=False)
        if ctx.needs_input_grad[1]:
            lower = lower_gram(grad, phi, width=block_width_for(int(phi.shape[1])))
            lower.diagonal().mul_(0.5)
            grad_kzz = _sandwich(chol, lower)
            grad_kzz.neg_()
        return grad_cross, grad_kzz, None


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
        self._chol_cache: tuple[float, list[torch.Tensor], torch.Tensor] | None = None
        self._held = False

    def kernel_parameters(self) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter]:
        """The parameters ``Kzz`` depends on: ``Z``, ``log l`` and ``log sk2``."""
        return (self.inducing, self.log_lengthscale, self.log_outputscale)

    @contextmanager
    def fixed_kernel(self, *, keep_graph: bool = False) -> Iterator[None]:
        """Hold the base kernel and the inducing points fixed inside the block: ``phi(g) =
        Lzz^{-1} k_Z(g)`` uses a factor ``Lzz`` computed once for as long as they keep their
        values (:meth:`fixed_chol`), and they take no gradient. By default they leave the
        autograd graph; with ``keep_graph`` (DDP, whose reducer waits for every parameter's
        gradient on every step) they stay in it through ``k_Z(g)``, and the gradients they get
        there are discarded on leaving the block."""
        params = self.kernel_parameters()
        before = [p.requires_grad for p in params]
        self._held = True
        if not keep_graph:
            for p in params:
                p.requires_grad_(False)
        try:
            yield
        finally:
            self._held = False
            for p, flag in zip(params, before, strict=True):
                p.requires_grad_(flag)
                if keep_graph:
                    p.grad = None

    def fixed_chol(self) -> torch.Tensor:
        """``Lzz`` without gradient, recomputed only when the kernel parameters' values (or the
        jitter) differ from those it was computed with. Values are compared, not version
        counters: torch's fused AdamW updates parameters without bumping them."""
        params = [p.detach() for p in self.kernel_parameters()]
        cached = self._chol_cache
        if (
            cached is None
            or cached[0] != self.jitter
            or not all(
                a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
                for a, b in zip(cached[1], params, strict=True)
            )
        ):
            with torch.no_grad():
                cached = (self.jitter, [p.clone() for p in params], self.chol())
            self._chol_cache = cached
        return cached[2]

    def outputscale(self) -> torch.Tensor:
        """The base-kernel variance ``sk2`` (0-d)."""
        return self.log_outputscale.exp()

    def kernel(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """The base kernel ``k~(a, b)`` between rows of ``a`` (n, h) and ``b`` (m, h), (n, m)
        (:func:`scaled_rbf` of ``a / l`` and ``b / l``)."""
        inv_l = torch.exp(-self.log_lengthscale)
        if torch.is_grad_enabled():
            out: torch.Tensor = _ScaledRBF.apply(a * inv_l, b * inv_l, self.log_outputscale)
            return out
        return scaled_rbf(a * inv_l, b * inv_l, self.log_outputscale)

    def cross(self, g: torch.Tensor) -> torch.Tensor:
        """``k_Z(g)``: the base kernel between ``g`` (b, h) and the inducing points, (b, r)."""
        return self.kernel(g, self.inducing)

    def _kzz(self) -> torch.Tensor:
        """``Kzz`` (r, r); the Cholesky factor reads its lower triangle."""
        return self.kernel(self.inducing, self.inducing)

    def _absolute_jitter(self) -> float:
        """``j sk2``, the jitter added to ``Kzz``'s diagonal (a number: no gradient)."""
        return self.jitter * float(self.outputscale().detach())

    def chol(self) -> torch.Tensor:
        """``Lzz = chol(Kzz + j sk2 I)``, lower triangular (r, r)."""
        return stable_cholesky(self._kzz(), jitter=self._absolute_jitter())

    def forward(self, g: torch.Tensor) -> torch.Tensor:
        """``phi(g) = Lzz^{-1} k_Z(g)``, shape (b, r); ``Lzz`` from :meth:`fixed_chol` when the
        kernel is held (:meth:`fixed_kernel`) or no gradient is to reach it."""
        if not self._factor_is_fixed():
            out: torch.Tensor = _Whiten.apply(self.cross(g), self._kzz(), self._absolute_jitter())
            return out
        return torch.linalg.solve_triangular(
            self.fixed_chol().T, self.cross(g), upper=True, left=False
        )

    def _factor_is_fixed(self) -> bool:
        """Whether ``Lzz`` takes no gradient here: the kernel is held, or no gradient is to
        reach its parameters (then :meth:`fixed_chol` serves it)."""
        needs_grad = any(p.requires_grad for p in self.kernel_parameters())
        return self._held or not (torch.is_grad_enabled() and needs_grad)

    def raw_features(self, g: torch.Tensor) -> torch.Tensor:
        """``k_Z(g)``; ``phi(g)' M = k_Z(g)' Lzz^{-T} M``."""
        return self.cross(g)

    def pullback(self, matrix: torch.Tensor) -> torch.Tensor:
        """``Lzz^{-T} M`` for ``M`` of shape (r,) or (r, k) (triangular solve)."""
        mat = matrix.unsqueeze(-1) if matrix.dim() == 1 else matrix
        chol = self.fixed_chol() if self._factor_is_fixed() else self.chol()
        out = torch.linalg.solve_triangular(chol.T, mat, upper=True)
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

    def kernel_parameters(self) -> tuple[nn.Parameter, ...]:
        """None: the SiLU basis has no base kernel."""
        return ()

    @contextmanager
    def fixed_kernel(self, *, keep_graph: bool = False) -> Iterator[None]:
        """Nothing to hold fixed (no base kernel)."""
        yield

    def raw_features(self, g: torch.Tensor) -> torch.Tensor:
        """``phi(g)`` itself (nothing to fold)."""
        return self.forward(g)

    def pullback(self, matrix: torch.Tensor) -> torch.Tensor:
        """Identity: ``phi(g)' M`` needs no folding."""
        return matrix

    def prior_variance(self, g: torch.Tensor) -> torch.Tensor | None:
        """``None``: the SiLU basis has no base kernel."""
        return None
