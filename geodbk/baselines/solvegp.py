"""SOLVE-GP: sparse orthogonal variational inference (methods.md §4; paper 003).

f = f_par + f_perp with inducing points Z (M) for f_par and orthogonal inducing points O (M2)
for f_perp. Kernel k: Matérn-3/2, one lengthscale per input (``ard=True``) or one shared by all
(``ard=False``, 003 App. G). With Luu = chol(Kuu), a(x) = Luu^{-1} k(Z, x),
c(x, x') = k(x, x') - a(x)'a(x'), Cvv = c(O, O), Lvv = chol(Cvv), b(x) = Lvv^{-1} c(O, x) and
the variational factors in whitened coordinates q(u~) = N(m~_u, S~_u), q(v~) = N(m~_v, S~_v)
(u = Luu u~, v = Lvv v~):

* mean(x) = a(x)'m~_u + b(x)'m~_v   [= k(x,Z) Kuu^{-1} m_u + c(x,O) Cvv^{-1} m_v, 003 eq. 33]
* var_f(x) = a(x)'S~_u a(x) + c(x, x) + b(x)'(S~_v - I) b(x)
  [= k(x,Z)Kuu^{-1}S_uKuu^{-1}k(Z,x) + c(x,x) + c(x,O)Cvv^{-1}(S_v - Cvv)Cvv^{-1}c(O,x), eq. 34]
* ELBO = Σ_i [log N(y_i; mean_i, s2_i) - var_f,i / (2 s2_i)] - KL(q(u)||N(0,Kuu))
  - KL(q(v)||N(0,Cvv)) (eqs. 31, 35, 36; the KLs equal those of q(u~), q(v~) against N(0, I))
  with s2_i = s2 (constant noise) or s2_i = s2_floor + s2_meas / tests_i^p (``noise="tests"``);
  mini-batch estimate (n/b) Σ_B; the loss is -ELBO / n.
* predictive var = var_f(x) + s2(x) (s2(tests) at the query for the tests-aware noise).

Parameterisation (``whiten``): ``True`` learns (m~, L~) with S~ = L~L~' directly (003 App. F),
started at N(0, I). ``False`` learns the paper's unwhitened q(u) = N(m_u, L_uL_u'),
q(v) = N(m_v, L_vL_v') (003 App. D.1, Algorithm 1), started at the priors N(0, Kuu) and
N(0, Cvv) (App. G); they enter the formulas above as m~_u = Luu^{-1} m_u,
L~_u = Luu^{-1} L_u (likewise v with Lvv), which is Algorithm 1's E = Luu^{-T} B, F = L_u'E and
Compute_KL (P = Luu^{-1} L_u, a = Luu^{-1} m_u).

Each step costs O(M³ + M2³ + b (M + M2)² ) for the two Cholesky factors and solves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from geodbk.baselines.base import TorchBaseline, make_noise
from geodbk.baselines.kernels import Positive, matern32_ard, psd_cholesky, tri_solve
from geodbk.objectives import gaussian_kl_standard, gaussian_nll
from geodbk.variational import VariationalWeights


class SolveGPModule(nn.Module):
    """Parameters of SOLVE-GP: Z, O, q(u), q(v), kernel, noise, constant mean.

    ``ard``: one lengthscale per input (else one shared). ``whiten``: ``q_u``, ``q_v`` hold the
    whitened q(u~), q(v~) (else the unwhitened q(u), q(v)); see the module docstring.
    """

    def __init__(
        self,
        d: int,
        m_u: int,
        m_v: int,
        *,
        lengthscale: float,
        noise_init: float,
        noise: str = "constant",
        noise_power: bool = False,
        ard: bool = True,
        whiten: bool = True,
    ):
        super().__init__()
        self.whiten = bool(whiten)
        self.Z = nn.Parameter(torch.zeros(m_u, d))
        self.O = nn.Parameter(torch.zeros(m_v, d))
        # q(u) and q(v) in the core's N(m, LL') parameterisation (whitened or not: ``whiten``).
        self.q_u = VariationalWeights(m_u)
        self.q_v = VariationalWeights(m_v)
        self.lengthscale = Positive(lengthscale, shape=(d,) if ard else (1,))
        self.outputscale = Positive(1.0)
        self.noise = make_noise(noise, init=noise_init, noise_power=noise_power)
        self.mean_const = nn.Parameter(torch.zeros(()))

    def k(self, A: Tensor, B: Tensor) -> Tensor:
        """Matérn-3/2 kernel (ARD or one shared lengthscale)."""
        return matern32_ard(A, B, lengthscale=self.lengthscale(), outputscale=self.outputscale())

    def _k64(self, A: Tensor, B: Tensor) -> Tensor:
        """The kernel evaluated in float64 (the factors below are ill-conditioned in float32)."""
        return matern32_ard(
            A.double(),
            B.double(),
            lengthscale=self.lengthscale().double(),
            outputscale=self.outputscale().double(),
        )

    def factors(self) -> tuple[Tensor, Tensor, Tensor]:
        """(Luu, a(O) = Luu^{-1} k(Z, O), Lvv) — the x-independent parts, in float64.

        Cvv = k(O,O) - a(O)'a(O) is a difference of nearly equal terms wherever Z already
        explains f (e.g. many points on a 1-D input); in float32 it turns indefinite and the
        gradients NaN, so the factors are formed in float64 and the results cast back.
        """
        Luu = psd_cholesky(self._k64(self.Z, self.Z), jitter=1e-6)
        aO = tri_solve(Luu, self._k64(self.Z, self.O))
        Cvv = self._k64(self.O, self.O) - aO.T @ aO
        # c(O, O) can be ~0 where Z already explains f: jitter relative to the kernel variance.
        Lvv = psd_cholesky(Cvv, jitter=1e-6, scale=self.outputscale())
        return Luu, aO, Lvv

    def whitened_q(
        self, factors: tuple[Tensor, Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(m~_u, L~_u, m~_v, L~_v) in float64: q(u~) = N(m~_u, L~_uL~_u'), likewise v~.

        Whitened: the parameters. Unwhitened: m~ = L0^{-1} m, L~ = L0^{-1} L with L0 = Luu for
        u and Lvv for v (lower triangular with diag L / diag L0 > 0).
        """
        qs = [(q.mean.double(), q.scale_tril().double()) for q in (self.q_u, self.q_v)]
        if self.whiten:
            return qs[0][0], qs[0][1], qs[1][0], qs[1][1]
        Luu, _, Lvv = self.factors() if factors is None else factors
        out: list[Tensor] = []
        for (m, L), L0 in zip(qs, (Luu, Lvv), strict=True):
            out += [tri_solve(L0, m.unsqueeze(-1)).squeeze(-1), tri_solve(L0, L)]
        return out[0], out[1], out[2], out[3]

    def latent(
        self, X: Tensor, factors: tuple[Tensor, Tensor, Tensor] | None = None
    ) -> tuple[Tensor, Tensor]:
        """Predictive mean and latent variance at X (eqs. 33–34, see the module docstring).

        ``factors``: :meth:`factors` if already computed for this step.
        """
        Luu, aO, Lvv = self.factors() if factors is None else factors
        a = tri_solve(Luu, self._k64(self.Z, X))  # (M, b)
        cOx = self._k64(self.O, X) - aO.T @ a  # c(O, x), (M2, b)
        bx = tri_solve(Lvv, cOx)  # (M2, b)
        mu_u, Lu, mu_v, Lv = self.whitened_q((Luu, aO, Lvv))
        mean = a.T @ mu_u + bx.T @ mu_v
        var_f = (
            (Lu.T @ a).pow(2).sum(0)
            + self.outputscale().double()
            - a.pow(2).sum(0)
            + (Lv.T @ bx).pow(2).sum(0)
            - bx.pow(2).sum(0)
        )
        return mean.to(X.dtype) + self.mean_const, var_f.to(X.dtype)

    def kl(self, factors: tuple[Tensor, Tensor, Tensor] | None = None) -> Tensor:
        """KL(q(u)||N(0,Kuu)) + KL(q(v)||N(0,Cvv)) (eqs. 35–36).

        Computed as KL(q(u~)||N(0,I)) + KL(q(v~)||N(0,I)): in the parameters' dtype when
        whitened, in float64 from :meth:`whitened_q` (Algorithm 1's Compute_KL) when not.
        """
        if self.whiten:
            kl_u = gaussian_kl_standard(self.q_u.mean, self.q_u.scale_tril())
            return kl_u + gaussian_kl_standard(self.q_v.mean, self.q_v.scale_tril())
        mu_u, Lu, mu_v, Lv = self.whitened_q(factors)
        kl = gaussian_kl_standard(mu_u, Lu) + gaussian_kl_standard(mu_v, Lv)
        return kl.to(self.q_u.mean.dtype)


def solvegp_loss(
    module: SolveGPModule, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
) -> Tensor:
    """-ELBO / n: mean_B[-log N(y_i; mean_i, s2_i) + var_f,i / (2 s2_i)] + KL / n.

    ``s2_i = s2(tests_i)`` for the tests-aware noise, the constant ``s2`` otherwise.
    """
    factors = module.factors()
    mean, var_f = module.latent(X, factors)
    s2 = module.noise(tests)
    data = (gaussian_nll(y, mean, s2) + var_f / (2.0 * s2)).mean()
    return data + module.kl(factors) / n_total


@dataclass(kw_only=True, eq=False, repr=False)
class SolveGPRegressor(TorchBaseline):
    """SOLVE-GP estimator (mini-batch, Adam, Matérn-3/2).

    Parameters
    ----------
    num_inducing, num_orthogonal
        M and M2 (seed default 1024 each; capped at n). Z and O start at two disjoint random
        subsets of the training inputs (seeded).
    lengthscale, noise_init
        Initial Matérn lengthscale and noise variance (of a single test for ``noise="tests"``;
        standardised units).
    ard
        One lengthscale per input (``False``: one shared by all inputs, as in 003 App. G).
    whiten
        Learn the whitened q(u~), q(v~), started at N(0, I) (``False``: the unwhitened q(u),
        q(v) of 003 App. D.1 / Algorithm 1, started at the priors N(0, Kuu), N(0, Cvv), as in
        its experiments, App. G).
    epochs, batch_size, lr, patience, seed, device, dtype, noise, noise_power
        As in ``TorchBaseline``; ``noise``: ``"constant"`` or ``"tests"`` (s2_i in the ELBO's
        data term).
    """

    model_name = "solve-gp"

    num_inducing: int = 1024
    num_orthogonal: int = 1024
    lengthscale: float = 0.3
    noise_init: float = 0.5
    ard: bool = True
    whiten: bool = True

    def _validate(self) -> None:
        super()._validate()
        for name in ("ard", "whiten"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def _sizes(self, X: Tensor, y: Tensor) -> dict[str, Any]:
        n, d = X.shape
        m_u = min(int(self.num_inducing), n)
        m_v = min(int(self.num_orthogonal), max(n - m_u, 1))
        return {"d": d, "m_u": m_u, "m_v": m_v}

    def _make_module(self, sizes: dict[str, Any]) -> nn.Module:
        return SolveGPModule(
            sizes["d"],
            sizes["m_u"],
            sizes["m_v"],
            lengthscale=self.lengthscale,
            noise_init=self.noise_init,
            noise=self.noise,
            noise_power=self.noise_power,
            ard=bool(self.ard),
            whiten=bool(self.whiten),
        )

    def _init_module(self, module: nn.Module, X: Tensor, y: Tensor) -> None:
        assert isinstance(module, SolveGPModule)
        rng = np.random.default_rng(self.seed)
        perm = torch.as_tensor(rng.permutation(X.shape[0]), device=X.device)
        m_u, m_v = module.Z.shape[0], module.O.shape[0]
        module.Z.copy_(X[perm[:m_u]])
        rest = perm[m_u : m_u + m_v]
        if rest.numel() < m_v:  # tiny data: jitter copies
            rest = perm[torch.arange(m_v, device=X.device) % perm.numel()]
            module.O.copy_(X[rest] + 1e-3 * torch.randn_like(X[rest]))
        else:
            module.O.copy_(X[rest])
        # q at N(0, I) (whitened) or at the priors N(0, Kuu), N(0, Cvv) (unwhitened, 003 App. G)
        if module.whiten:
            scales = [torch.eye(q.mean.shape[0]) for q in (module.q_u, module.q_v)]
        else:
            Luu, _, Lvv = module.factors()
            scales = [Luu, Lvv]
        for q, scale in zip((module.q_u, module.q_v), scales, strict=True):
            zeros = torch.zeros(q.mean.shape[0], dtype=X.dtype, device=X.device)
            q.set_(zeros, scale.to(dtype=X.dtype, device=X.device))
        module.mean_const.fill_(float(y.mean()))

    def _loss(
        self, module: nn.Module, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
    ) -> Tensor:
        assert isinstance(module, SolveGPModule)
        return solvegp_loss(module, X, y, n_total, tests)

    def _predict_latent(
        self, module: nn.Module, X: Tensor, tests: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        assert isinstance(module, SolveGPModule)
        mean, var_f = module.latent(X)
        return mean, var_f, module.noise(tests).expand_as(mean)

    def _kernel(self, module: nn.Module, A: Tensor, B: Tensor) -> Tensor:
        assert isinstance(module, SolveGPModule)
        return module.k(A, B)
