"""CaGP-Opt: the computation-aware GP with learned block-sparse actions (methods.md §3).

Kernel: Matérn-3/2 ARD + Gaussian noise s2, K_hat = K + s2 I. Inference uses i actions
S (n × i); column j is nonzero only on its contiguous block of B = ceil(n / i) rows. The rows
are put in **Morton (Z-order) order of the inputs** (:func:`geodbk.baselines.kernels.morton_order`,
stable, so the order is deterministic) before the blocks are cut, which makes each block a
spatially compact cluster of tiles. When n is not a multiple of i the last rows are padded with
zero-weight rows.

With G = S'K_hat S, v = G^{-1} S'y and C = S G^{-1} S':

* mean mu(x) = K(x, X) C y = (K(x, X) S) v
* latent variance var_f(x) = k(x, x) - K(x, X) C K(X, x); predictive variance adds s2
* loss (negative CaGP-ELBO, divided by n):
  1/2 [ (||y - mu(X)||² + Σ_j var_f(x_j)) / s2 + (n - i) log s2 + n log 2π + v'S'KSv
  - tr(G^{-1} S'KS) + logdet G - logdet S'S ]

Everything needs only KS (n × i): it is built in row chunks ``K[chunk, :] S`` with
``torch.utils.checkpoint`` so that the chunk's n-wide kernel rows are recomputed in the backward
pass instead of stored; memory stays O(n·i + chunk·n). Each step costs about n² kernel
evaluations (forward) plus the same again in the backward pass; prediction needs all training
inputs (stored in the bundle).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from geodbk.baselines.base import TorchBaseline
from geodbk.baselines.kernels import Positive, matern32_ard, morton_order, psd_cholesky, tri_solve
from geodbk.likelihoods import GaussianNoise


class CaGPModule(nn.Module):
    """Parameters and cached posterior of CaGP-Opt (sizes: n, d, i actions, block size B)."""

    X: Tensor
    mask: Tensor
    v: Tensor
    chol_G: Tensor

    def __init__(
        self, n: int, d: int, n_actions: int, block: int, *, lengthscale: float, noise: float
    ):
        super().__init__()
        self.n, self.d, self.i, self.block = n, d, n_actions, block
        n_pad = n_actions * block
        self.register_buffer("X", torch.zeros(n_pad, d))
        self.register_buffer("mask", torch.zeros(n_actions, block))
        self.actions = nn.Parameter(torch.ones(n_actions, block) / math.sqrt(block))
        self.lengthscale = Positive(lengthscale, shape=(d,))
        self.outputscale = Positive(1.0)
        self.noise = GaussianNoise(init=noise)
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
        """K(A, X) S, (len(A), i), built chunk by chunk (checkpointed when ``grad``)."""
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
    module: CaGPModule, y_pad: Tensor, *, chunk_elems: int, grad: bool
) -> dict[str, Tensor]:
    """All quantities of the CaGP loss from KS (see the module docstring)."""
    n, i, B = module.n, module.i, module.block
    w = module.weights()
    s2 = module.noise()
    KS = module.kernel_times_actions(
        module.X[:n], chunk_rows=_chunk_rows(i * B, chunk_elems), grad=grad
    )
    KS_pad = torch.cat([KS, KS.new_zeros(i * B - n, i)], dim=0).view(i, B, i)
    StKS = torch.einsum("jb,jbk->jk", w, KS_pad)
    StKS = 0.5 * (StKS + StKS.T)
    StS = w.pow(2).sum(-1)  # S'S is diagonal: blocks are disjoint
    G = StKS + s2 * torch.diag_embed(StS)
    L = psd_cholesky(G, jitter=1e-8)
    r = y_pad - module.mean_const
    r = r * module.mask.reshape(-1)
    Sty = torch.einsum("jb,jb->j", w, r.view(i, B))
    v = torch.cholesky_solve(Sty.unsqueeze(-1), L).squeeze(-1)
    mu = KS @ v
    A = tri_solve(L, KS.T)  # L^{-1} (KS)', (i, n)
    sum_var = n * module.outputscale() - A.pow(2).sum()
    quad = v @ StKS @ v
    trace = torch.diagonal(torch.cholesky_solve(StKS, L)).sum()
    logdet_G = 2.0 * torch.log(torch.diagonal(L)).sum()
    logdet_StS = torch.log(StS).sum()
    resid = (r[:n] - mu).pow(2).sum()
    loss = 0.5 * (
        (resid + sum_var) / s2
        + (n - i) * torch.log(s2)
        + n * math.log(2.0 * math.pi)
        + quad
        - trace
        + logdet_G
        - logdet_StS
    )
    return {"loss": loss / n, "v": v, "chol_G": L, "KS": KS, "mu": mu}


class CaGPRegressor(TorchBaseline):
    """CaGP-Opt estimator (full batch; Adam; Matérn-3/2 ARD; i block-sparse actions).

    Parameters
    ----------
    n_actions
        Number of actions i (capped at n). Seed default 512.
    chunk_elems
        Kernel entries held at once when forming K S (memory O(n·i + chunk_elems)).
    lengthscale, noise
        Initial Matérn lengthscale (all dimensions) and noise variance (standardised units).
    **kwargs
        ``epochs``, ``lr``, ``patience``, ``seed``, ``device``, ``dtype`` (see ``TorchBaseline``).
    """

    model_name = "cagp"
    full_batch = True

    def __init__(
        self,
        *,
        n_actions: int = 512,
        chunk_elems: int = 2**22,
        lengthscale: float = 0.3,
        noise: float = 0.5,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("lr", 0.05)  # full batch: one step per epoch
        super().__init__(**kwargs)
        self.n_actions = int(n_actions)
        self.chunk_elems = int(chunk_elems)
        self.init_lengthscale = float(lengthscale)
        self.init_noise = float(noise)

    def get_params(self) -> dict[str, Any]:
        return {
            **super().get_params(),
            "n_actions": self.n_actions,
            "chunk_elems": self.chunk_elems,
            "lengthscale": self.init_lengthscale,
            "noise": self.init_noise,
        }

    def _sizes(self, X: Tensor, y: Tensor) -> dict[str, Any]:
        n, d = X.shape
        block = math.ceil(n / min(self.n_actions, n))
        i = math.ceil(n / block)  # every block non-empty: (i - 1)·block < n <= i·block
        return {"n": n, "d": d, "n_actions": i, "block": block}

    def _make_module(self, sizes: dict[str, Any]) -> nn.Module:
        return CaGPModule(
            sizes["n"],
            sizes["d"],
            sizes["n_actions"],
            sizes["block"],
            lengthscale=self.init_lengthscale,
            noise=self.init_noise,
        )

    def _order_and_pad(self, module: CaGPModule, X: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        order = torch.as_tensor(morton_order(X.detach().cpu().numpy()), device=X.device)
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

    def _loss(self, module: nn.Module, X: Tensor, y: Tensor, n_total: int) -> Tensor:
        assert isinstance(module, CaGPModule)
        terms = cagp_terms(module, self._y_pad, chunk_elems=self.chunk_elems, grad=True)
        module.v.copy_(terms["v"].detach())
        module.chol_G.copy_(terms["chol_G"].detach())
        return terms["loss"]

    def _refresh(self, module: nn.Module, X: Tensor, y: Tensor) -> None:
        assert isinstance(module, CaGPModule)
        terms = cagp_terms(module, self._y_pad, chunk_elems=self.chunk_elems, grad=False)
        module.v.copy_(terms["v"])
        module.chol_G.copy_(terms["chol_G"])

    def _predict_latent(self, module: nn.Module, X: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        assert isinstance(module, CaGPModule)
        KsS = module.kernel_times_actions(
            X, chunk_rows=_chunk_rows(module.X.shape[0], self.chunk_elems), grad=False
        )
        mean = KsS @ module.v + module.mean_const
        A = tri_solve(module.chol_G, KsS.T)
        var_f = module.outputscale() - A.pow(2).sum(0)
        return mean, var_f, module.noise().expand_as(mean)

    def _kernel(self, module: nn.Module, A: Tensor, B: Tensor) -> Tensor:
        assert isinstance(module, CaGPModule)
        return module.k(A, B)

    def dense_actions(self) -> np.ndarray:
        """The dense action matrix S (n × i) in the Morton row order of ``training_inputs``."""
        module = self._check_fitted()
        assert isinstance(module, CaGPModule)
        w = module.weights().detach()
        S = torch.zeros(module.i * module.block, module.i, dtype=w.dtype)
        for j in range(module.i):
            S[j * module.block : (j + 1) * module.block, j] = w[j].cpu()
        return S[: module.n].double().numpy()

    def training_inputs(self) -> np.ndarray:
        """The training inputs in the Morton row order used by the actions, (n, d)."""
        module = self._check_fitted()
        assert isinstance(module, CaGPModule)
        return module.X[: module.n].detach().double().cpu().numpy()
