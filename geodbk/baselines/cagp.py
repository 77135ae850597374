"""CaGP-Opt: the computation-aware GP with learned block-sparse actions (methods.md §3).

Kernel: Matérn-3/2 ARD + Gaussian noise, K_hat = K + D with D = s2 I (constant noise) or
D = diag(s2_j), s2_j = s2_floor + s2_meas / tests_j^p (``noise="tests"``). Inference uses i
actions S (n × i); column j is nonzero only on its contiguous block of B = ceil(n / i) rows, cut
after the rows are put in Morton (Z-order) order, so each block is a spatially compact cluster of
tiles (:meth:`CaGPRegressor._order_and_pad`). With G = S'K_hat S, v = G^{-1} S'y and
C = S G^{-1} S':

* mean mu(x) = K(x, X) C y = (K(x, X) S) v;
* latent variance var_f(x) = k(x, x) - K(x, X) C K(X, x); the predictive variance adds s2(x)
  (s2(tests) at the query for the tests-aware noise);
* loss: the negative CaGP-ELBO divided by n (:func:`cagp_terms`).

Everything needs only KS (n × i), built in checkpointed row chunks
(:meth:`CaGPModule.kernel_times_actions`). The learning rate is constant or, as paper 002,
decays linearly to 0.1·lr at the last epoch (:meth:`CaGPRegressor._scheduler`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from geodbk.baselines.base import TorchBaseline, make_noise
from geodbk.baselines.kernels import Positive, matern32_ard, morton_order, psd_cholesky, tri_solve

#: Values of ``CaGPRegressor(lr_schedule=...)``.
LR_SCHEDULES = ("constant", "linear")


class CaGPModule(nn.Module):
    """Parameters and cached posterior of CaGP-Opt (sizes: n, d, i actions, block size B)."""

    X: Tensor
    mask: Tensor
    v: Tensor
    chol_G: Tensor

    def __init__(
        self,
        n: int,
        d: int,
        n_actions: int,
        block: int,
        *,
        lengthscale: float,
        noise_init: float,
        noise: str = "constant",
        noise_power: bool = False,
    ):
        super().__init__()
        self.n, self.d, self.i, self.block = n, d, n_actions, block
        n_pad = n_actions * block
        self.register_buffer("X", torch.zeros(n_pad, d))
        self.register_buffer("mask", torch.zeros(n_actions, block))
        self.actions = nn.Parameter(torch.ones(n_actions, block) / math.sqrt(block))
        self.lengthscale = Positive(lengthscale, shape=(d,))
        self.outputscale = Positive(1.0)
        self.noise = make_noise(noise, init=noise_init, noise_power=noise_power)
        self.mean_const = nn.Parameter(torch.zeros(()))
        # Cached posterior at the current parameters: v = G^{-1} S'(y - c), chol(G).
        self.register_buffer("v", torch.zeros(n_actions))
        self.register_buffer("chol_G", torch.eye(n_actions))

    def weights(self) -> Tensor:
        """Block-sparse action weights, (i, B), zero on padding rows."""
        return self.actions * self.mask

    def k(self, A: Tensor, B: Tensor) -> Tensor:
        """Matérn-3/2 ARD kernel K(A, B)."""
        return matern32_ard(A, B, lengthscale=self.lengthscale(), outputscale=self.outputscale())

    def kernel_times_actions(self, A: Tensor, *, chunk_rows: int, grad: bool) -> Tensor:
        """K(A, X) S, (len(A), i), built chunk by chunk (checkpointed when ``grad``).

        With ``torch.utils.checkpoint`` a chunk's n-wide kernel rows are recomputed in the
        backward pass instead of stored, so memory stays O(n·i + chunk·n); a training step costs
        about n² kernel evaluations forward plus the same again backward. Prediction needs all
        training inputs (stored in the bundle).
        """
        w = self.weights()
        ls, os_ = self.lengthscale(), self.outputscale()

        def block(a: Tensor, X: Tensor, w_: Tensor, ls_: Tensor, os2: Tensor) -> Tensor:
            Kc = matern32_ard(a, X, lengthscale=ls_, outputscale=os2)
            return torch.einsum("cib,ib->ci", Kc.view(a.shape[0], self.i, self.block), w_)

        out = []
        for start in range(0, A.shape[0], chunk_rows):
            a = A[start : start + chunk_rows]
            if grad:
                out.append(checkpoint(block, a, self.X, w, ls, os_, use_reentrant=False))
            else:
                out.append(block(a, self.X, w, ls, os_))
        return torch.cat(out, dim=0)


def release_freed_chunks_to_os(threshold_bytes: int = 1 << 20) -> bool:
    """Make glibc return freed large blocks to the OS (``mallopt(M_MMAP_THRESHOLD, 1 MiB)``).

    glibc raises its mmap threshold dynamically after the first large ``free``; from then on the
    chunk-sized kernel temporaries come from the heap, where the small live chunk outputs pin
    them, and the resident set grows to about 3 n² floats although at most one chunk is alive
    (measured: 1.8 GB RSS after the forward pass at n = 12,000; 0.1 GB with a fixed 1 MiB
    threshold). Fixing the threshold keeps CaGP's memory O(n·i + chunk). Process-wide; a no-op
    (returns False) where glibc's ``mallopt`` is unavailable.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(-3, int(threshold_bytes)))  # -3 = M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def _chunk_rows(n_pad: int, budget: int) -> int:
    return max(1, budget // max(n_pad, 1))


def cagp_terms(
    module: CaGPModule,
    y_pad: Tensor,
    *,
    chunk_elems: int,
    grad: bool,
    tests_pad: Tensor | None = None,
) -> dict[str, Tensor]:
    """All quantities of the CaGP loss from KS.

    The loss is the negative CaGP-ELBO -E_q[log p(y|f)] + KL(q(f) || p(f)), divided by n:
    1/2 [ Σ_j ((y_j - mu(x_j))² + var_f(x_j)) / s2_j + Σ_j log s2_j + n log 2π + v'S'KSv
    - tr(G^{-1} S'KS) + logdet G - logdet S'DS ], where S'DS is diagonal (disjoint blocks),
    (S'DS)_kk = Σ_b w_kb² s2_kb; with D = s2 I the noise terms reduce to
    (||y - mu||² + Σ_j var_f(x_j)) / s2 + (n - i) log s2 - logdet S'S.

    ``tests_pad``: the training rows' test counts in the Morton, padded row order of ``y_pad``
    (``noise="tests"``: D = diag(s2(tests))); ``None`` for the constant noise (D = s2 I).
    """
    n, i, B = module.n, module.i, module.block
    w = module.weights()
    s2 = module.noise(tests_pad)
    KS = module.kernel_times_actions(
        module.X[:n], chunk_rows=_chunk_rows(i * B, chunk_elems), grad=grad
    )
    KS_pad = torch.cat([KS, KS.new_zeros(i * B - n, i)], dim=0).view(i, B, i)
    StKS = torch.einsum("jb,jbk->jk", w, KS_pad)
    StKS = 0.5 * (StKS + StKS.T)
    StS = w.pow(2).sum(-1)  # S'S is diagonal: blocks are disjoint
    hetero = s2.ndim > 0
    # S'DS, diagonal as well: Σ_b w_kb² s2_kb (padding rows have w = 0).
    StDS = (w.pow(2) * s2.view(i, B)).sum(-1) if hetero else s2 * StS
    G = StKS + torch.diag_embed(StDS)
    L = psd_cholesky(G, jitter=1e-8)
    r = y_pad - module.mean_const
    r = r * module.mask.reshape(-1)
    Sty = torch.einsum("jb,jb->j", w, r.view(i, B))
    v = torch.cholesky_solve(Sty.unsqueeze(-1), L).squeeze(-1)
    mu = KS @ v
    A = tri_solve(L, KS.T)  # L^{-1} (KS)', (i, n)
    quad = v @ StKS @ v
    trace = torch.diagonal(torch.cholesky_solve(StKS, L)).sum()
    logdet_G = 2.0 * torch.log(torch.diagonal(L)).sum()
    if hetero:
        s2n = s2[:n]
        var_f = module.outputscale() - A.pow(2).sum(0)
        loss = 0.5 * (
            (((r[:n] - mu).pow(2) + var_f) / s2n).sum()
            + torch.log(s2n).sum()
            + n * math.log(2.0 * math.pi)
            + quad
            - trace
            + logdet_G
            - torch.log(StDS).sum()  # logdet S'DS
        )
    else:
        sum_var = n * module.outputscale() - A.pow(2).sum()
        resid = (r[:n] - mu).pow(2).sum()
        loss = 0.5 * (
            (resid + sum_var) / s2
            + (n - i) * torch.log(s2)
            + n * math.log(2.0 * math.pi)
            + quad
            - trace
            + logdet_G
            - torch.log(StS).sum()  # logdet S'S
        )
    return {"loss": loss / n, "v": v, "chol_G": L, "KS": KS, "mu": mu}


@dataclass(kw_only=True, eq=False, repr=False)
class CaGPRegressor(TorchBaseline):
    """CaGP-Opt estimator (full batch; Adam; Matérn-3/2 ARD; i block-sparse actions).

    Parameters
    ----------
    n_actions
        Number of actions i (capped at n). Seed default 512.
    chunk_elems
        Kernel entries held at once when forming K S (memory O(n·i + chunk_elems)).
    lengthscale, noise_init
        Initial Matérn lengthscale (all dimensions) and noise variance (of a single test for
        ``noise="tests"``; standardised units).
    epochs, batch_size, lr, patience, seed, device, dtype, noise, noise_power
        As in ``TorchBaseline`` (``batch_size`` unused: full batch); ``lr`` defaults to 0.05
        (one optimiser step per epoch); ``noise``: ``"constant"`` or ``"tests"`` (D =
        diag(s2_j) in K_hat = K + D).
    lr_schedule
        ``"constant"`` or ``"linear"`` (lr to 0.1·lr at the last epoch, paper 002).
    """

    model_name = "cagp"
    full_batch = True

    n_actions: int = 512
    chunk_elems: int = 2**22
    lengthscale: float = 0.3
    noise_init: float = 0.5
    lr_schedule: str = "constant"
    lr: float = 0.05

    def _validate(self) -> None:
        super()._validate()
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")

    def _scheduler(
        self, optimizer: torch.optim.Optimizer
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        """``lr_schedule="linear"``: ``LinearLR(1 -> 0.1)`` reaching 0.1·lr at the last epoch.

        Over epochs - 1 steps: lr_e = lr (1 - 0.9 (e - 1) / (epochs - 1)) at epoch e.
        """
        if self.lr_schedule != "linear":
            return None
        return torch.optim.lr_scheduler.LinearLR(
            optimizer, start_factor=1.0, end_factor=0.1, total_iters=max(int(self.epochs) - 1, 1)
        )

    def _sizes(self, X: Tensor, y: Tensor) -> dict[str, Any]:
        n, d = X.shape
        block = math.ceil(n / min(int(self.n_actions), n))
        i = math.ceil(n / block)  # every block non-empty: (i - 1)·block < n <= i·block
        return {"n": n, "d": d, "n_actions": i, "block": block}

    def _make_module(self, sizes: dict[str, Any]) -> nn.Module:
        return CaGPModule(
            sizes["n"],
            sizes["d"],
            sizes["n_actions"],
            sizes["block"],
            lengthscale=self.lengthscale,
            noise_init=self.noise_init,
            noise=self.noise,
            noise_power=self.noise_power,
        )

    def _order_and_pad(self, module: CaGPModule, X: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """The rows in Morton order (:func:`~geodbk.baselines.kernels.morton_order`, stable, so
        the order is deterministic), padded to i·B rows with copies of the last input and
        y = 0 (the mask gives them zero action weight)."""
        order = torch.as_tensor(morton_order(X.detach().cpu().numpy()), device=X.device)
        self._order = order
        n_pad = module.i * module.block
        Xs, ys = X[order], y[order]
        pad = n_pad - X.shape[0]
        if pad:
            Xs = torch.cat([Xs, Xs[-1:].expand(pad, -1)], dim=0)
            ys = torch.cat([ys, ys.new_zeros(pad)], dim=0)
        return Xs, ys

    def _init_module(self, module: nn.Module, X: Tensor, y: Tensor) -> None:
        assert isinstance(module, CaGPModule)
        if X.device.type == "cpu":
            release_freed_chunks_to_os()
        Xs, ys = self._order_and_pad(module, X, y)
        module.X.copy_(Xs)
        mask = torch.zeros(module.i * module.block, dtype=X.dtype, device=X.device)
        mask[: X.shape[0]] = 1.0
        module.mask.copy_(mask.view(module.i, module.block))
        counts = module.mask.sum(-1, keepdim=True).clamp_min(1.0)
        module.actions.copy_(module.mask / counts.sqrt() + (1.0 - module.mask))
        module.mean_const.fill_(float(y.mean()))
        self._y_pad = ys

    def _tests_pad(self, module: CaGPModule, tests: Tensor | None) -> Tensor | None:
        """The training rows' test counts in the Morton, padded order (padding rows: 1)."""
        if tests is None:
            return None
        t = tests[self._order]
        pad = module.i * module.block - t.shape[0]
        return torch.cat([t, t.new_ones(pad)]) if pad else t

    def _terms(self, module: nn.Module, tests: Tensor | None, *, grad: bool) -> Tensor:
        """CaGP's loss on all the data; caches the posterior's ``v`` and ``chol_G`` (detached)."""
        assert isinstance(module, CaGPModule)
        terms = cagp_terms(
            module,
            self._y_pad,
            chunk_elems=self.chunk_elems,
            grad=grad,
            tests_pad=self._tests_pad(module, tests),
        )
        module.v.copy_(terms["v"].detach())
        module.chol_G.copy_(terms["chol_G"].detach())
        return terms["loss"]

    def _loss(
        self, module: nn.Module, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
    ) -> Tensor:
        return self._terms(module, tests, grad=True)

    def _refresh(
        self, module: nn.Module, X: Tensor, y: Tensor, tests: Tensor | None = None
    ) -> None:
        self._terms(module, tests, grad=False)

    def _predict_latent(
        self, module: nn.Module, X: Tensor, tests: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        assert isinstance(module, CaGPModule)
        KsS = module.kernel_times_actions(
            X, chunk_rows=_chunk_rows(module.X.shape[0], self.chunk_elems), grad=False
        )
        mean = KsS @ module.v + module.mean_const
        A = tri_solve(module.chol_G, KsS.T)
        var_f = module.outputscale() - A.pow(2).sum(0)
        return mean, var_f, module.noise(tests).expand_as(mean)

    def _kernel(self, module: nn.Module, A: Tensor, B: Tensor) -> Tensor:
        assert isinstance(module, CaGPModule)
        return module.k(A, B)
