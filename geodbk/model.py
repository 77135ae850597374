"""The DBK Gaussian process as a torch module: backbone + basis + q(w) + noise + constant mean."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from geodbk.backbone import ResidualMLP
from geodbk.bases import RBFInducingBasis, SiLUBasis
from geodbk.likelihoods import NOISE_MODELS, GaussianNoise, TestsNoise
from geodbk.posterior import FoldedWeights, WeightPosterior, feature_sq_bound, fold_into_basis
from geodbk.triangular import block_width_for, latent_moments
from geodbk.variational import VariationalWeights

__all__ = ["EXPANSIONS", "TRAINING_BLOCK_MIN_RANK", "DBKModel", "ModelOutput"]

EXPANSIONS = ("rbf", "silu")
#: Smallest rank whose training forward sums ``||L'phi||^2`` over L's lower-triangular column
#: blocks (:func:`geodbk.triangular.latent_moments`); below it one dense product is as fast.
TRAINING_BLOCK_MIN_RANK = 512


@dataclass(frozen=True)
class ModelOutput:
    """What the objectives need on a batch.

    Attributes
    ----------
    phi
        Basis functions ``phi(x)``, (b, r).
    mean
        ``mu(x) = m' phi(x) + c``, (b,).
    var_f
        ``||L' phi(x)||^2``, (b,).
    phi_sq
        ``||phi(x)||^2``, (b,).
    var_correction
        ``k~(x, x) - ||phi(x)||^2`` for inducing-point bases, else ``None``.
    scale_tril
        q(w)'s factor ``L`` (r, r) that ``var_f`` used, for the KL term of the same step.
    """

    phi: torch.Tensor
    mean: torch.Tensor
    var_f: torch.Tensor
    phi_sq: torch.Tensor
    var_correction: torch.Tensor | None
    scale_tril: torch.Tensor


class DBKModel(nn.Module):
    """Deep basis kernel GP ``f(x) = c + w' phi(x)``, ``phi = expansion ∘ backbone``.

    Parameters
    ----------
    input_dim
        Input dimension ``d``.
    expansion
        ``"rbf"`` (whitened RBF-ARD inducing basis) or ``"silu"`` (Bayesian last layer).
    rank
        Number of basis functions ``r``.
    hidden
        Backbone width ``h``.
    jitter
        Relative Cholesky jitter of the RBF basis.
    noise_init, noise_floor
        Initial noise variance (of a single test for ``noise="tests"``) and its floor.
    noise
        ``"constant"`` (``s2``, :class:`GaussianNoise`), ``"tests"``
        (``s2_i = s2_floor + s2_meas / tests_i^p``, :class:`TestsNoise`) or ``"tests+devices"``
        (``s2_i = s2_floor + s2_meas / tests_i^p + s2_dev / devices_i^q``, covariate (n, 2)
        ``[tests, devices]``; :class:`TestsNoise` with ``devices=True``).
    noise_power
        With ``noise="tests"`` / ``"tests+devices"``: learn the exponents ``p`` (and ``q``)
        (else 1).
    noise_urban
        With the tests-aware noise: a separate floor ``s2_floor_urban`` for urban tiles (the
        covariate's last column is then the urban flag; :class:`TestsNoise` with ``urban=True``).
    generator
        Generator for the basis and q(w) initialisation (the backbone's ``nn.Linear`` layers use
        torch's global RNG; seed it, e.g. under ``torch.random.fork_rng``).
    """

    def __init__(
        self,
        input_dim: int,
        *,
        expansion: str = "rbf",
        rank: int = 1024,
        hidden: int = 256,
        jitter: float = 1e-4,
        noise_init: float = 1e-2,
        noise_floor: float = 1e-6,
        noise: str = "constant",
        noise_power: bool = False,
        noise_urban: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if expansion not in EXPANSIONS:
            raise ValueError(f"expansion must be one of {EXPANSIONS}, got {expansion!r}")
        self.expansion = expansion
        self.backbone = ResidualMLP(input_dim, hidden)
        self.basis: RBFInducingBasis | SiLUBasis
        if expansion == "rbf":
            self.basis = RBFInducingBasis(hidden, rank, jitter=jitter, generator=generator)
        else:
            self.basis = SiLUBasis(hidden, rank, generator=generator)
        self.q = VariationalWeights(rank, generator=generator)
        if noise not in NOISE_MODELS:
            raise ValueError(f"noise must be one of {NOISE_MODELS}, got {noise!r}")
        self.noise_model = noise
        self.noise: GaussianNoise | TestsNoise
        if noise in ("tests", "tests+devices"):
            self.noise = TestsNoise(
                init=noise_init,
                floor=noise_floor,
                learn_power=noise_power,
                devices=noise == "tests+devices",
                urban=noise_urban,
            )
        else:
            if noise_urban:
                raise ValueError('noise_urban needs a tests-aware noise ("tests", "tests+devices")')
            self.noise = GaussianNoise(init=noise_init, floor=noise_floor)
        self.const_mean = nn.Parameter(torch.zeros(()))

    @property
    def rank(self) -> int:
        """Number of basis functions ``r``."""
        return self.q.rank

    def kernel_held(self, hold: bool, *, keep_graph: bool = False) -> AbstractContextManager[None]:
        """With ``hold``, the basis's base kernel and inducing points take no gradient inside
        the block and its Cholesky factor is reused (:meth:`RBFInducingBasis.fixed_kernel`,
        ``keep_graph`` as there); else nothing changes."""
        return self.basis.fixed_kernel(keep_graph=keep_graph) if hold else nullcontext()

    def backbone_parameters(self) -> list[nn.Parameter]:
        """Parameters of the backbone (the only ones with weight decay)."""
        return list(self.backbone.parameters())

    def other_parameters(self) -> list[nn.Parameter]:
        """All parameters that are not in the backbone."""
        ids = {id(p) for p in self.backbone.parameters()}
        return [p for p in self.parameters() if id(p) not in ids]

    def noise_var(self, tests: torch.Tensor | float | None = None) -> torch.Tensor:
        """Noise variance: ``s2`` (0-d) or, for the tests-aware noise, ``s2_i`` of ``tests``.

        ``tests`` is (b,) or, for ``noise="tests+devices"``, (b, 2) ``[tests, devices]`` ((b,)
        then means ``devices = tests``); with ``noise_urban`` the urban flag is the last column. ``tests=None`` with the tests-aware noise gives a single
        test's variance ``s2_floor + s2_meas (+ s2_dev)``; the constant noise ignores ``tests``.
        """
        return self.noise.variance(tests)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """``phi(x)``, (b, r)."""
        return self.basis(self.backbone(x))

    def forward(self, x: torch.Tensor) -> ModelOutput:
        """Basis, predictive mean and latent variance under ``q(w)`` on a batch ``x`` (b, d)."""
        g = self.backbone(x)
        phi = self.basis(g)
        width = block_width_for(self.rank) if self.rank >= TRAINING_BLOCK_MIN_RANK else 0
        scale_tril = self.q.scale_tril()
        mean, var_f, phi_sq = latent_moments(phi, self.q.mean, scale_tril, width=width)
        mean = mean + self.const_mean
        prior = self.basis.prior_variance(g)
        correction = None if prior is None else (prior - phi_sq).clamp_min(0.0)
        return ModelOutput(
            phi=phi,
            mean=mean,
            var_f=var_f,
            phi_sq=phi_sq,
            var_correction=correction,
            scale_tril=scale_tril,
        )

    def weight_posterior(self) -> WeightPosterior:
        """The current ``q(w)`` as a :class:`WeightPosterior`."""
        return WeightPosterior(mean=self.q.mean, scale_tril=self.q.scale_tril())

    @torch.no_grad()
    def set_weight_posterior(self, posterior: WeightPosterior) -> None:
        """Replace ``q(w)`` by ``posterior`` (e.g. the exact posterior after exact training)."""
        self.q.set_(posterior.mean, posterior.scale_tril)

    def min_noise_var(self) -> float:
        """The smallest noise variance the model can give: ``s2`` (constant noise) or
        ``floor + min(s2_floor, s2_floor_urban)`` (tests-aware noise, ``tests -> inf``)."""
        if isinstance(self.noise, TestsNoise):
            floors = torch.minimum(self.noise.s2_floor, self.noise.s2_floor_urban)
            return float(self.noise.floor + floors.detach())
        return float(self.noise.variance().detach())

    @torch.no_grad()
    def fold(
        self, *, variance_correction: bool = False, variance_rtol: float = 0.0
    ) -> FoldedWeights:
        """Precompute the x-independent part of prediction (see :func:`fold_into_basis`).

        ``variance_rtol > 0`` truncates the variance factor so that the dropped latent
        variance is at most ``variance_rtol`` times :meth:`min_noise_var` at every input
        (``||phi||^2 <= sk2`` for DBK-RBF, the LayerNorm bound of :func:`feature_sq_bound`
        for DBK-SiLU); ``variance_rtol=0`` (the default) keeps the exact factor: on trained
        models the bound at :data:`~geodbk.posterior.VARIANCE_RTOL` keeps every eigenpair, and
        the eigendecomposition would cost each validation pass for nothing.
        """
        with_whitener = variance_correction and isinstance(self.basis, RBFInducingBasis)
        if variance_rtol <= 0.0:
            return fold_into_basis(self.basis, self.weight_posterior(), with_whitener=with_whitener)
        return fold_into_basis(
            self.basis,
            self.weight_posterior(),
            with_whitener=with_whitener,
            variance_rtol=variance_rtol,
            min_noise_var=self.min_noise_var(),
            feature_bound=feature_sq_bound(
                self.basis, out_norm=getattr(self.backbone, "out_norm", None)
            ),
        )

    @torch.no_grad()
    def predict_folded(
        self,
        x: torch.Tensor,
        folded: FoldedWeights,
        *,
        tests: torch.Tensor | float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Predictive mean, latent variance and predictive variance with folded weights.

        ``u = raw_features(g(x))``; ``mu = u'a + c``; ``var_f = ||B'u||^2`` (``B`` (r, k) when
        truncated, see :meth:`fold`) (+ ``k~(x,x) -
        ||W'u||^2`` when the folded weights carry a whitener); ``var = var_f + s2`` with
        ``s2 = noise_var(tests)`` (per point for the tests-aware noise).
        One backbone pass plus two (three with the correction) r-vector products per point.
        """
        mean, var_f = self.latent_folded(x, folded)
        return mean, var_f, var_f + self.noise_var(tests)

    @torch.no_grad()
    def latent_folded(
        self, x: torch.Tensor, folded: FoldedWeights
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Latent mean ``mu = u'a + c`` and variance ``var_f`` of :meth:`predict_folded`."""
        g = self.backbone(x)
        u = self.basis.raw_features(g)
        mean = u @ folded.mean_vec + self.const_mean
        var_f = folded.latent_variance(u)
        if folded.whitener is None:
            return mean, var_f
        prior = self.basis.prior_variance(g)
        assert prior is not None
        return mean, var_f + (prior - (u @ folded.whitener).square_().sum(-1)).clamp_min(0.0)
