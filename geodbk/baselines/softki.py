"""SoftKI: soft kernel interpolation (methods.md §5, paper 004), tuned or as its paper defines it.

m interpolation points Z; weights w(x) = softmax_j(-||x - z_j|| / T) (004 eq. 17 with a
temperature T); Q(x, x') = w(x)' Kzz w(x') with Kzz an RBF kernel on Z (ARD, or one shared
lengthscale). This is a rank-m deep-basis-like kernel with phi(x) = Lz' w(x), Lz = chol(Kzz), so
Q = phi(x)'phi(x'). Batch covariance Sigma = Phi_B Phi_B' + D, D = s2 I or diag(s2_i)
(``noise="tests"``, s2_i = s2_floor + s2_meas / tests_i^p).

Loss per datum: the exact batch NLL -log N(r_B; 0, Sigma) / b in O(b m²) by the Woodbury
identity and the determinant lemma (:func:`batch_marginal_nll`; the QR solver:
:func:`whitened_batch_nll`), or the Hutchinson pseudo-loss of 004 eqs. 19–21
(:func:`hutchinson_pseudo_nll`). The posterior over all training data is solved in float64 in
weight space by Cholesky or by the QR of 004 eqs. 26–30 (:meth:`SoftKIRegressor._refresh`); both
give the same posterior in exact arithmetic.

The defaults are the project's tuned model; ``geodbk.baselines.registry.PAPER_PRESET["softki"]``
selects paper 004's options (:class:`SoftKIRegressor`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from geodbk.baselines.base import TorchBaseline, make_noise
from geodbk.baselines.kernels import Positive, far_centre, psd_cholesky, rbf_ard, tri_solve
from geodbk.sklearn_api import validated_X

#: Values of the string options.
Z_INITS = ("random", "kmeans")
LOSSES = ("exact", "hutchinson")
SOLVERS = ("cholesky", "qr")

#: ``z_init="kmeans"`` runs scikit-learn's ``KMeans`` up to this many training rows and
#: ``MiniBatchKMeans`` beyond.
KMEANS_MAX_N = 50_000
#: Training rows at a time when the posterior is solved over all of them.
REFRESH_CHUNK = 8192


class SoftKIModule(nn.Module):
    """Interpolation points, log-temperature, RBF hyperparameters, noise, constant mean.

    ``ard``: one lengthscale per input (else one shared); ``learn_noise`` /
    ``learn_temperature``: whether those parameters are trained (fixed ones keep
    ``requires_grad=False``). Buffers ``alpha`` / ``chol_Lambda`` hold the posterior:
    ``Lambda^{-1} Phi' r`` / ``chol(Lambda)`` (Cholesky solver) or ``alpha`` of 004 eq. 30 /
    ``R'`` (QR solver).
    """

    alpha: Tensor
    chol_Lambda: Tensor

    def __init__(
        self,
        d: int,
        m: int,
        *,
        lengthscale: float,
        noise_init: float,
        noise: str = "constant",
        noise_power: bool = False,
        ard: bool = True,
        learn_noise: bool = True,
        learn_temperature: bool = True,
    ):
        super().__init__()
        self.Z = nn.Parameter(torch.zeros(m, d))
        self.log_temperature = nn.Parameter(torch.zeros(()), requires_grad=bool(learn_temperature))
        self.lengthscale = Positive(lengthscale, shape=(d,) if ard else (1,))
        self.outputscale = Positive(1.0)
        self.noise = make_noise(noise, init=noise_init, noise_power=noise_power)
        if not learn_noise:
            self.noise.requires_grad_(False)
        self.mean_const = nn.Parameter(torch.zeros(()))
        self.register_buffer("alpha", torch.zeros(m))
        self.register_buffer("chol_Lambda", torch.eye(m))

    def weights(self, X: Tensor) -> Tensor:
        """Soft interpolation weights softmax_j(-||x - z_j|| / T), (n, m).

        The distances are taken after shifting ``X`` and ``Z`` by :func:`far_centre` of ``Z``
        (they do not change), so that inputs far from the origin do not cancel to rounding noise
        in float32.
        """
        centre = far_centre(self.Z)
        Xc, Zc = X - centre, self.Z - centre
        d2 = (Xc.pow(2).sum(-1, keepdim=True) + Zc.pow(2).sum(-1) - 2.0 * Xc @ Zc.T).clamp_min(
            1e-12
        )
        return torch.softmax(-d2.sqrt() / self.log_temperature.exp(), dim=-1)

    def kzz_chol(self) -> Tensor:
        """Lz = chol(Kzz + jitter)."""
        Kzz = rbf_ard(
            self.Z, self.Z, lengthscale=self.lengthscale(), outputscale=self.outputscale()
        )
        return psd_cholesky(Kzz, jitter=1e-6)

    def features(self, X: Tensor, Lz: Tensor | None = None) -> Tensor:
        """phi(x) = Lz' w(x), stacked as rows (n, m)."""
        Lz = self.kzz_chol() if Lz is None else Lz
        return self.weights(X) @ Lz


def batch_marginal_nll(phi: Tensor, r: Tensor, s2: Tensor) -> Tensor:
    """-log N(r; 0, phi phi' + D) / b via Woodbury and the determinant lemma (Cholesky).

    ``s2`` 0-d: D = s2 I, Lambda = phi'phi + s2 I:
    log p = -b/2 log 2π - (b - m)/2 log s2 - 1/2 logdet Lambda - ||r||²/(2 s2)
    + ||chol(Lambda)^{-1} phi'r||²/(2 s2). ``s2`` of shape (b,): D = diag(s2_i), computed with
    phi~ = D^{-1/2} phi, r~ = D^{-1/2} r, Lambda~ = I + phi~'phi~:
    log p = -b/2 log 2π - 1/2 Σ log s2_i - 1/2 logdet Lambda~ - ||r~||²/2
    + ||chol(Lambda~)^{-1} phi~'r~||²/2.
    """
    b, m = phi.shape
    if s2.ndim > 0:
        root = s2.sqrt()
        phi_w, r_w = phi / root.unsqueeze(-1), r / root
        Lw = psd_cholesky(
            phi_w.T @ phi_w + torch.eye(m, dtype=phi.dtype, device=phi.device), jitter=1e-10
        )
        proj_w = tri_solve(Lw, (phi_w.T @ r_w).unsqueeze(-1)).squeeze(-1)
        logp_w = (
            -0.5 * b * math.log(2.0 * math.pi)
            - 0.5 * torch.log(s2).sum()
            - torch.log(torch.diagonal(Lw)).sum()
            - 0.5 * r_w.pow(2).sum()
            + 0.5 * proj_w.pow(2).sum()
        )
        return -logp_w / b
    Lam = phi.T @ phi + s2 * torch.eye(m, dtype=phi.dtype, device=phi.device)
    L = psd_cholesky(Lam, jitter=1e-10)
    proj = tri_solve(L, (phi.T @ r).unsqueeze(-1)).squeeze(-1)
    logp = (
        -0.5 * b * math.log(2.0 * math.pi)
        - 0.5 * (b - m) * torch.log(s2)
        - torch.log(torch.diagonal(L)).sum()
        - r.pow(2).sum() / (2.0 * s2)
        + proj.pow(2).sum() / (2.0 * s2)
    )
    return -logp / b


class WhitenedFactor:
    """Factor of Lambda~ = I + phi~'phi~ = R'R, phi~ = D^{-1/2} phi, for Sigma = phi phi' + D.

    ``solver="cholesky"``: R = chol(Lambda~)'; ``solver="qr"``: [phi~; I] = Q R (reduced QR, so
    the Gram matrix is never formed). Gives Sigma^{-1} v and logdet Sigma by the Woodbury
    identity and the determinant lemma.
    """

    def __init__(self, phi: Tensor, s2: Tensor, *, solver: str) -> None:
        b, m = phi.shape
        eye = torch.eye(m, dtype=phi.dtype, device=phi.device)
        self.root = s2.sqrt().expand(b)
        self.s2 = s2.expand(b)
        self.phi_w = phi / self.root.unsqueeze(-1)
        self.solver = solver
        if solver == "qr":
            Q, R = torch.linalg.qr(torch.cat([self.phi_w, eye], dim=0))
            self.Q_top, self.R = Q[:b], R
        else:
            self.R = psd_cholesky(eye + self.phi_w.T @ self.phi_w, jitter=1e-10).T

    def project(self, v_w: Tensor) -> Tensor:
        """R^{-T} phi~' v~ for whitened columns v~ (b, k): Q_top' v~ (QR) or a triangular solve."""
        if self.solver == "qr":
            return self.Q_top.T @ v_w
        return tri_solve(self.R.T, self.phi_w.T @ v_w)

    def solve(self, v: Tensor) -> Tensor:
        """Sigma^{-1} v = D^{-1/2} (v~ - phi~ R^{-1} R^{-T} phi~' v~), v~ = D^{-1/2} v, (b, k)."""
        v_w = v / self.root.unsqueeze(-1)
        u = torch.linalg.solve_triangular(self.R, self.project(v_w), upper=True)
        return (v_w - self.phi_w @ u) / self.root.unsqueeze(-1)

    def logdet(self) -> Tensor:
        """logdet Sigma = Σ log s2_i + 2 Σ log|R_kk|."""
        return torch.log(self.s2).sum() + 2.0 * torch.log(torch.diagonal(self.R).abs()).sum()


def whitened_batch_nll(phi: Tensor, r: Tensor, s2: Tensor, *, solver: str) -> Tensor:
    """Exact -log N(r; 0, phi phi' + D) / b: [b log 2π + logdet Sigma + ||r~||² - ||R^{-T} phi~'r~||²] / (2b)."""
    b = phi.shape[0]
    fac = WhitenedFactor(phi, s2, solver=solver)
    r_w = (r / fac.root).unsqueeze(-1)
    quad = r_w.pow(2).sum() - fac.project(r_w).pow(2).sum()
    return 0.5 * (b * math.log(2.0 * math.pi) + fac.logdet() + quad) / b


def hutchinson_pseudo_nll(
    phi: Tensor, r: Tensor, s2: Tensor, *, solver: str, num_probes: int
) -> Tensor:
    """Hutchinson pseudo-loss of -log N(r; 0, Sigma) / b, Sigma = phi phi' + D (004 eqs. 19–21).

    [b/2 log 2π + 1/2 sg(logdet Sigma) + b0'r - 1/2 b0'Sigma b0 + 1/2 (H - sg(H))] / b with
    b0 = sg(Sigma^{-1} r), H = (1/L) Σ_j sg(Sigma^{-1} a_j)' Sigma a_j, a_j ~ N(0, I) (L =
    ``num_probes``; drawn from torch's global generator). Value: the exact NLL (b0'r - 1/2
    b0'Sigma b0 = 1/2 r'Sigma^{-1} r); gradient: 004 eq. 21, the exact data term -1/2
    b0'dSigma b0 (and -b0'1 for the mean) plus Hutchinson's unbiased estimate
    1/2 (1/L) Σ_j b_j'dSigma a_j of 1/2 tr(Sigma^{-1} dSigma) (Maddox et al. 2022). No gradient
    passes through a factorisation.
    """
    b = phi.shape[0]
    probes = torch.randn(b, int(num_probes), dtype=phi.dtype, device=phi.device)
    with torch.no_grad():
        fac = WhitenedFactor(phi.detach(), s2.detach(), solver=solver)
        sol = fac.solve(torch.cat([r.detach().unsqueeze(-1), probes], dim=1))
        logdet = fac.logdet()
    b0, B = sol[:, 0], sol[:, 1:]

    def sigma_times(v: Tensor) -> Tensor:  # Sigma v = phi (phi'v) + D v, differentiable
        return phi @ (phi.T @ v) + s2.expand(b).unsqueeze(-1) * v

    data = b0 @ r - 0.5 * (b0.unsqueeze(-1) * sigma_times(b0.unsqueeze(-1))).sum()
    H = (B * sigma_times(probes)).sum() / probes.shape[1]
    return (0.5 * b * math.log(2.0 * math.pi) + 0.5 * logdet + data + 0.5 * (H - H.detach())) / b


@dataclass(kw_only=True, eq=False, repr=False)
class SoftKIRegressor(TorchBaseline):
    """SoftKI estimator (mini-batch, Adam); tuned by default, paper 004's with its options.

    Parameters
    ----------
    num_points
        m interpolation points (seed default 512; capped at n).
    lengthscale, noise_init
        Initial RBF lengthscale and noise variance (of a single test for ``noise="tests"``;
        standardised units).
    z_init
        ``"random"``: a random subset of the training inputs (+1e-4 jitter); ``"kmeans"``: the
        k-means centres of the training inputs (004 Alg. 1 line 1; ``KMeans`` up to
        :data:`KMEANS_MAX_N` rows, ``MiniBatchKMeans`` beyond; ``random_state=seed``).
    temperature
        Initial temperature T (> 0); ``None``: half the median nearest-neighbour distance
        between the initial points. 004's eq. 17 is T = 1, fixed.
    learn_temperature, learn_noise
        Train T / the noise (``False``: fixed at the initial value; 004 §5.3 fixes the noise
        at beta² = 1e-3).
    ard
        One lengthscale per input (``False``: one shared lengthscale, 004 §5.1).
    loss
        ``"exact"`` batch marginal likelihood or the ``"hutchinson"`` pseudo-loss (004 Def. 4.2).
    num_probes
        Probe vectors L of the Hutchinson pseudo-loss (10, as Maddox et al. 2022).
    solver
        ``"cholesky"`` or ``"qr"`` (004 eqs. 26–30): how the batch systems and the posterior
        are solved.
    epochs, batch_size, lr, patience, seed, device, dtype, noise, noise_power
        As in ``TorchBaseline``; ``noise``: ``"constant"`` or ``"tests"`` (D = diag(s2_i) in
        the marginal likelihood and the posterior).
    """

    model_name = "softki"

    num_points: int = 512
    lengthscale: float = 0.3
    noise_init: float = 0.5
    z_init: str = "random"
    temperature: float | None = None
    learn_temperature: bool = True
    learn_noise: bool = True
    ard: bool = True
    loss: str = "exact"
    num_probes: int = 10
    solver: str = "cholesky"

    def _validate(self) -> None:
        super()._validate()
        for name, value, allowed in (
            ("z_init", self.z_init, Z_INITS),
            ("loss", self.loss, LOSSES),
            ("solver", self.solver, SOLVERS),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        for name in ("learn_temperature", "learn_noise", "ard"):
            if not isinstance(getattr(self, name), bool | np.bool_):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        probes = self.num_probes
        if isinstance(probes, bool) or not isinstance(probes, int | np.integer) or probes < 1:
            raise ValueError(f"num_probes must be a positive integer, got {probes!r}")
        temp = self.temperature
        if temp is not None and (
            isinstance(temp, bool)
            or not isinstance(temp, int | float | np.integer | np.floating)
            or not math.isfinite(temp)
            or temp <= 0
        ):
            raise ValueError(f"temperature must be a positive number or None, got {temp!r}")

    def _sizes(self, X: Tensor, y: Tensor) -> dict[str, Any]:
        return {"d": X.shape[1], "m": min(int(self.num_points), X.shape[0])}

    def _make_module(self, sizes: dict[str, Any]) -> nn.Module:
        return SoftKIModule(
            sizes["d"],
            sizes["m"],
            lengthscale=self.lengthscale,
            noise_init=self.noise_init,
            noise=self.noise,
            noise_power=self.noise_power,
            ard=bool(self.ard),
            learn_noise=bool(self.learn_noise),
            learn_temperature=bool(self.learn_temperature),
        )

    def _initial_points(self, X: Tensor, m: int) -> Tensor:
        """Z at initialisation: random training inputs (+1e-4 jitter) or k-means centres."""
        if self.z_init == "kmeans":
            from sklearn.cluster import KMeans, MiniBatchKMeans

            Xn = X.detach().cpu().double().numpy()
            km: KMeans | MiniBatchKMeans
            if Xn.shape[0] <= KMEANS_MAX_N:
                km = KMeans(n_clusters=m, n_init=1, random_state=int(self.seed))
            else:
                km = MiniBatchKMeans(
                    n_clusters=m, n_init=1, batch_size=max(1024, 4 * m), random_state=int(self.seed)
                )
            centres = km.fit(Xn).cluster_centers_
            return torch.as_tensor(centres, dtype=X.dtype, device=X.device)
        rng = np.random.default_rng(self.seed)
        idx = torch.as_tensor(rng.permutation(X.shape[0])[:m], device=X.device)
        return X[idx] + 1e-4 * torch.randn_like(X[idx])

    def _init_module(self, module: nn.Module, X: Tensor, y: Tensor) -> None:
        assert isinstance(module, SoftKIModule)
        Z = self._initial_points(X, module.Z.shape[0])
        module.Z.copy_(Z)
        if self.temperature is not None:
            temperature = float(self.temperature)
        elif Z.shape[0] > 1:
            D = torch.cdist(Z, Z) + torch.diag(
                torch.full((Z.shape[0],), math.inf, dtype=Z.dtype, device=Z.device)
            )
            temperature = max(0.5 * float(D.min(dim=1).values.median()), 1e-4)
        else:
            temperature = 0.5
        module.log_temperature.fill_(math.log(temperature))
        module.mean_const.fill_(float(y.mean()))

    def _loss(
        self, module: nn.Module, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
    ) -> Tensor:
        assert isinstance(module, SoftKIModule)
        phi, r, s2 = module.features(X), y - module.mean_const, module.noise(tests)
        if self.loss == "hutchinson":
            return hutchinson_pseudo_nll(
                phi, r, s2, solver=self.solver, num_probes=int(self.num_probes)
            )
        if self.solver == "qr":
            return whitened_batch_nll(phi, r, s2, solver="qr")
        return batch_marginal_nll(phi, r, s2)

    def _refresh(
        self, module: nn.Module, X: Tensor, y: Tensor, tests: Tensor | None = None
    ) -> None:
        """The posterior over all training data, in chunks of :data:`REFRESH_CHUNK` rows (float64).

        ``solver="cholesky"`` (weight space): Lambda = Phi'Phi + s2 I, mean(x) = phi(x)'
        Lambda^{-1} Phi' r, var_f(x) = s2 ||chol(Lambda)^{-1} phi(x)||². Tests-aware noise:
        omega_i = s1 / s2_i with s1 = s2(tests = 1), Lambda = Phi' Omega Phi + s1 I, mean(x) =
        phi(x)' Lambda^{-1} Phi' Omega r, var_f(x) = s1 ||chol(Lambda)^{-1} phi(x)||².
        ``solver="qr"``: :meth:`_refresh_qr`.
        """
        assert isinstance(module, SoftKIModule)
        if self.solver == "qr":
            self._refresh_qr(module, X, y, tests)
            return
        chunk_size = REFRESH_CHUNK
        Lz = module.kzz_chol()
        m = Lz.shape[0]
        PtP = torch.zeros(m, m, dtype=torch.float64, device=X.device)
        Ptr = torch.zeros(m, dtype=torch.float64, device=X.device)
        s2 = module.noise().double()  # s1: s2, or a single test's variance (tests-aware)
        for start in range(0, X.shape[0], chunk_size):
            phi = module.features(X[start : start + chunk_size], Lz).double()
            r = (y[start : start + chunk_size] - module.mean_const).double()
            if tests is not None:  # omega_i = s1 / s2_i
                omega = s2 / module.noise(tests[start : start + chunk_size]).double()
                PtP += phi.T @ (omega.unsqueeze(-1) * phi)
                Ptr += phi.T @ (omega * r)
            else:
                PtP += phi.T @ phi
                Ptr += phi.T @ r
        L = psd_cholesky(
            PtP + s2 * torch.eye(m, dtype=torch.float64, device=X.device), jitter=1e-12
        )
        alpha = torch.cholesky_solve(Ptr.unsqueeze(-1), L).squeeze(-1)
        module.alpha.copy_(alpha.to(module.alpha.dtype))
        module.chol_Lambda.copy_(L.to(module.chol_Lambda.dtype))

    def _refresh_qr(self, module: SoftKIModule, X: Tensor, y: Tensor, tests: Tensor | None) -> None:
        """004 eqs. 26–30 in float64: the QR of [A | b], A = [D^{-1/2} W Kzz; U], b = [D^{-1/2} r; 0].

        Row chunks are folded in one at a time: T <- R factor of [T; A_chunk | b_chunk], starting
        from [U | 0] (U = Lz', U'U = Kzz), so memory is O(chunk·m). Then T = [[R, Q'b], [0, ρ]],
        alpha = R^{-1} Q'b, mean(x) = K^_xz(x) alpha and var_f(x) = ||R^{-T} K^_zx(x)||²
        (A'A = C^ = Kzz + K^_zx D^{-1} K^_xz).
        """
        chunk_size = REFRESH_CHUNK
        Lz = module.kzz_chol().double()
        m = Lz.shape[0]
        Kzz = Lz @ Lz.T
        zeros = torch.zeros(m, 1, dtype=torch.float64, device=X.device)
        T = torch.cat([Lz.T, zeros], dim=1)  # [U | 0], (m, m + 1)
        for start in range(0, X.shape[0], chunk_size):
            tb = None if tests is None else tests[start : start + chunk_size]
            root = module.noise(tb).double().sqrt()
            Kxz = module.weights(X[start : start + chunk_size]).double() @ Kzz
            r = (y[start : start + chunk_size] - module.mean_const).double()
            rows = torch.cat(
                [Kxz / root.expand(r.shape[0]).unsqueeze(-1), (r / root).unsqueeze(-1)], dim=1
            )
            T = torch.linalg.qr(torch.cat([T, rows], dim=0), mode="r").R[: m + 1]
        R, Qtb = T[:m, :m], T[:m, m]
        alpha = torch.linalg.solve_triangular(R, Qtb.unsqueeze(-1), upper=True).squeeze(-1)
        module.alpha.copy_(alpha.to(module.alpha.dtype))
        module.chol_Lambda.copy_(R.T.to(module.chol_Lambda.dtype))

    def _predict_latent(
        self, module: nn.Module, X: Tensor, tests: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        assert isinstance(module, SoftKIModule)
        if self.solver == "qr":
            # 004 eqs. 24/30: mean K^_xz alpha, var_f ||R^{-T} K^_zx||² (chol_Lambda holds R')
            Lz = module.kzz_chol()
            Kxz = module.weights(X) @ (Lz @ Lz.T)
            mean = Kxz @ module.alpha + module.mean_const
            var_f = tri_solve(module.chol_Lambda, Kxz.T).pow(2).sum(0)
            return mean, var_f, module.noise(tests).expand_as(mean)
        phi = module.features(X)
        mean = phi @ module.alpha + module.mean_const
        # s1 ||chol(Lambda)^{-1} phi||², s1 = s2 (constant) or s2(tests = 1) (tests-aware)
        var_f = module.noise() * tri_solve(module.chol_Lambda, phi.T).pow(2).sum(0)
        return mean, var_f, module.noise(tests).expand_as(mean)

    def _kernel(self, module: nn.Module, A: Tensor, B: Tensor) -> Tensor:
        assert isinstance(module, SoftKIModule)
        Lz = module.kzz_chol()
        return module.features(A, Lz) @ module.features(B, Lz).T

    def features(self, X: Any) -> np.ndarray:
        """phi(X) = W(X) Lz, (n, m) float64 in standardised-target units (as
        ``DBKRegressor.features``), so that ``kernel(X, X') = phi(X) phi(X')'``; ``X`` is checked
        as in :meth:`predict`."""
        module = self._check_fitted()
        assert isinstance(module, SoftKIModule)
        x_np = validated_X(self, X, reset=False)
        with torch.no_grad():
            phi = module.features(self._tensor(x_np))
        return phi.double().cpu().numpy()
