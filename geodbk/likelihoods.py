"""Gaussian observation noise with a variance floor.

The objectives take the noise variance as a tensor broadcastable to the batch, so a
heteroscedastic per-point variance (e.g. ``s2_i = s2_floor + s2_meas / tests_i``, or with a
second covariate ``+ s2_dev / devices_i``) can be passed in place of the scalar one without
changing them.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from geodbk.noise_formula import class_floor, noise_terms

__all__ = ["NOISE_MODELS", "GaussianNoise", "TestsNoise", "inverse_softplus"]

#: Noise models: ``"constant"`` (:class:`GaussianNoise`), ``"tests"`` and ``"tests+devices"``
#: (:class:`TestsNoise`, without and with ``devices=True``).
NOISE_MODELS = ("constant", "tests", "tests+devices")


def inverse_softplus(value: float) -> float:
    """Return ``u`` with ``softplus(u) = log(1 + e^u) = value`` (``value > 0``)."""
    if value <= 0:
        raise ValueError(f"inverse_softplus needs a positive value, got {value}")
    if value > 20:
        return float(value)
    return float(math.log(math.expm1(value)))


class GaussianNoise(nn.Module):
    """Homoscedastic Gaussian noise, ``s2 = floor + softplus(raw)``.

    Parameters
    ----------
    init
        Initial variance ``s2`` (1e-2 in the method).
    floor
        Lower bound of ``s2`` (1e-6 in the method).
    """

    def __init__(self, *, init: float = 1e-2, floor: float = 1e-6) -> None:
        super().__init__()
        if init <= floor:
            raise ValueError(f"noise init {init} must exceed the floor {floor}")
        self.floor = float(floor)
        self.raw = nn.Parameter(torch.tensor(inverse_softplus(init - floor)))

    def variance(self, tests: torch.Tensor | float | None = None) -> torch.Tensor:
        """The noise variance ``s2`` as a 0-d tensor (broadcasts; ``tests`` is ignored)."""
        return self.floor + torch.nn.functional.softplus(self.raw)

    def forward(self, tests: torch.Tensor | float | None = None) -> torch.Tensor:
        """Alias of :meth:`variance`."""
        return self.variance(tests)

    #: Names of the columns of :meth:`components`.
    component_names: tuple[str, ...] = ("noise",)

    def components(self, tests: torch.Tensor | float | None = None, *, n: int = 1) -> torch.Tensor:
        """The variance as one component per point, (n, 1) (``tests`` is ignored)."""
        return self.variance().expand(n)[:, None]


class TestsNoise(nn.Module):
    """Per-tile noise of an average of ``tests_i`` speed tests (from ``devices_i`` devices).

    ``s2_i = floor + s2_floor + s2_meas / tests_i^p`` (noise model ``"tests"``) or, with
    ``devices=True`` (``"tests+devices"``),
    ``s2_i = floor + s2_floor + s2_meas / tests_i^p + s2_dev / devices_i^q``,
    with ``s2_floor = softplus(raw_floor)``, ``s2_meas = softplus(raw_meas)`` and (with
    ``devices=True``) ``s2_dev = softplus(raw_dev)``, all learned and positive; ``p = q = 1`` or,
    with ``learn_power=True``, ``p = softplus(raw_power)`` and ``q = softplus(raw_power_devices)``
    (initialised at 1). ``s2_floor`` is the variance shared by all tests of a tile (tile-level
    heterogeneity, quarter-to-quarter change), ``s2_meas`` that of a single test around the
    tile's mean and ``s2_dev`` that of a single device's offset; ``tests_i = devices_i = 1`` is
    one speed test, ``tests_i, devices_i -> inf`` leaves ``s2_floor``.

    With ``urban=True`` the floor depends on the tile's urban/rural class ``u_i`` (1 urban,
    0 rural): ``s2_floor(u_i) = (1 - u_i) s2_floor + u_i s2_floor_urban``, both learned and
    positive (``s2_floor`` is then the rural floor), for data where tile-level heterogeneity
    differs between towns and the country. On the Hawaii tiles it did not change
    cross-validated NLL (docs/decisions/noise_model.md), so it is opt-in.

    The covariate is ``tests`` (b,) or a (b, k) tensor whose columns are ``tests``, then
    ``devices`` (with ``devices=True``), then the urban flag (with ``urban=True``).

    Parameters
    ----------
    init
        Initial ``s2_floor + s2_meas`` of a single test, split evenly between them; with
        ``devices=True``, ``s2_dev`` starts at ``0.25 * init`` (so a single test from a single
        device starts at ``1.25 * init``). ``s2_floor_urban`` starts equal to ``s2_floor``.
    floor
        Lower bound of ``s2_i`` (1e-6).
    learn_power
        Learn the exponent ``p`` of ``tests`` (and ``q`` of ``devices``).
    devices
        Add the ``devices`` term (noise model ``"tests+devices"``). The covariate is then an
        (n, 2) tensor ``[tests, devices]``; an (n,) tensor or a scalar means
        ``devices = tests`` (each test from its own device).
    urban
        Learn a separate floor ``s2_floor_urban`` for urban tiles; the covariate's last column
        is then the urban flag (1 urban, 0 rural) and must be given.
    """

    def __init__(
        self,
        *,
        init: float = 1e-2,
        floor: float = 1e-6,
        learn_power: bool = False,
        devices: bool = False,
        urban: bool = False,
    ) -> None:
        super().__init__()
        if init <= floor:
            raise ValueError(f"noise init {init} must exceed the floor {floor}")
        self.floor = float(floor)
        half = inverse_softplus(0.5 * (init - floor))
        self.raw_floor = nn.Parameter(torch.tensor(half))
        self.raw_meas = nn.Parameter(torch.tensor(half))
        self.learn_power = bool(learn_power)
        self.devices = bool(devices)
        self.urban = bool(urban)
        if self.urban:
            self.raw_floor_urban = nn.Parameter(torch.tensor(half))
        one = inverse_softplus(1.0)
        if self.learn_power:
            self.raw_power = nn.Parameter(torch.tensor(one))
        if self.devices:
            self.raw_dev = nn.Parameter(torch.tensor(inverse_softplus(0.25 * init)))
            if self.learn_power:
                self.raw_power_devices = nn.Parameter(torch.tensor(one))

    @property
    def s2_floor(self) -> torch.Tensor:
        """``s2_floor`` (0-d): variance left when ``tests -> inf``."""
        return torch.nn.functional.softplus(self.raw_floor)

    @property
    def s2_floor_urban(self) -> torch.Tensor:
        """``s2_floor_urban`` (0-d): the floor of urban tiles (``s2_floor`` without ``urban``)."""
        if self.urban:
            return torch.nn.functional.softplus(self.raw_floor_urban)
        return self.s2_floor

    @property
    def s2_meas(self) -> torch.Tensor:
        """``s2_meas`` (0-d): variance of a single test around the tile's mean."""
        return torch.nn.functional.softplus(self.raw_meas)

    @property
    def s2_dev(self) -> torch.Tensor:
        """``s2_dev`` (0-d): variance of a single device's offset (0 without ``devices``)."""
        if self.devices:
            return torch.nn.functional.softplus(self.raw_dev)
        return torch.zeros((), dtype=self.raw_meas.dtype, device=self.raw_meas.device)

    @property
    def power(self) -> torch.Tensor:
        """Exponent ``p`` of ``tests`` (0-d; 1 unless learned)."""
        return self._exponent("raw_power")

    @property
    def power_devices(self) -> torch.Tensor:
        """Exponent ``q`` of ``devices`` (0-d; 1 unless learned)."""
        return self._exponent("raw_power_devices")

    def _exponent(self, name: str) -> torch.Tensor:
        if self.learn_power and hasattr(self, name):
            return torch.nn.functional.softplus(getattr(self, name))
        return torch.ones((), dtype=self.raw_meas.dtype, device=self.raw_meas.device)

    @property
    def columns(self) -> tuple[str, ...]:
        """Names of the covariate's columns: ``tests``, then ``devices``, then ``urban``."""
        return (
            ("tests",) + (("devices",) if self.devices else ()) + (("urban",) if self.urban else ())
        )

    def variance(self, tests: torch.Tensor | float | None = None) -> torch.Tensor:
        """``s2_i`` of the covariate; ``None`` means one test (from one device).

        Parameters
        ----------
        tests
            Number of tests per point, shape (b,) or scalar, each clamped to >= 1. With
            ``devices=True`` and/or ``urban=True`` a (b, k) tensor with the columns of
            :attr:`columns`; without the ``devices`` column, ``devices = tests``. With
            ``urban=True`` the urban column is required (``None`` or a 1-D covariate raise).
        """
        terms = self._terms(tests)
        out = terms[0]
        for term in terms[1:]:
            out = out + term
        return out

    def forward(self, tests: torch.Tensor | float | None = None) -> torch.Tensor:
        """Alias of :meth:`variance`."""
        return self.variance(tests)

    @property
    def component_names(self) -> tuple[str, ...]:
        """Names of the columns of :meth:`components`: ``floor``, ``meas`` (and ``dev``)."""
        return ("floor", "meas") + (("dev",) if self.devices else ())

    def components(self, tests: torch.Tensor | float | None = None, *, n: int = 1) -> torch.Tensor:
        """``s2_i`` split into its terms, (n, k) with rows summing to :meth:`variance`.

        Columns :attr:`component_names`: the floor (the numerical floor plus ``s2_floor``, or
        the row's class floor), ``s2_meas / tests_i^p`` and, with ``devices``,
        ``s2_dev / devices_i^q``. ``tests`` as in :meth:`variance`; ``n`` broadcasts scalars.
        """
        terms = self._terms(tests)
        size = max([n] + [int(t.numel()) for t in terms])
        return torch.stack([t.expand(size) for t in terms], dim=-1)

    def _terms(self, tests: torch.Tensor | float | None) -> list[torch.Tensor]:
        """The terms of ``s2_i`` in :attr:`component_names` order (0-d when ``tests=None``)."""
        if self.urban and (tests is None or torch.as_tensor(tests).ndim != 2):
            raise ValueError(
                "this noise model has a floor per urban/rural class: give the covariate as "
                f"(b, {len(self.columns)}) columns {self.columns}"
            )
        if tests is None:
            terms = [self.floor + self.s2_floor, self.s2_meas]
            return terms + ([self.s2_dev] if self.devices else [])
        cov = torch.as_tensor(tests, dtype=self.raw_meas.dtype, device=self.raw_meas.device)
        t = (cov[..., 0] if cov.ndim == 2 else cov).clamp_min(1.0)
        floor: torch.Tensor = self.floor + self.s2_floor
        if self.urban:
            u = cov[..., -1].clamp(0.0, 1.0)
            floor = self.floor + class_floor(
                rural=self.s2_floor, urban=self.s2_floor_urban, is_urban=u
            )
        has_devices_column = cov.ndim == 2 and cov.shape[-1] > 1 + int(self.urban)
        return noise_terms(
            floor=floor,
            s2_meas=self.s2_meas,
            tests=t,
            power=self.power if self.learn_power else 1.0,
            s2_dev=self.s2_dev if self.devices else None,
            devices=cov[..., 1].clamp_min(1.0) if self.devices and has_devices_column else None,
            power_devices=self.power_devices if self.learn_power else 1.0,
        )


def noise_parameters(noise: GaussianNoise | TestsNoise, *, y_var: float) -> dict[str, Any]:
    """The learned noise in the target's units.

    ``{"noise": "constant", "s2"}``, ``{"noise": "tests", "s2_floor", "s2_meas", "power"}``
    with ``s2_i = s2_floor + s2_meas / tests_i^power``, or ``{"noise": "tests+devices",
    "s2_floor", "s2_meas", "power", "s2_dev", "power_devices"}`` with
    ``s2_i = s2_floor + s2_meas / tests_i^power + s2_dev / devices_i^power_devices``; every
    variance times ``y_var`` (the target's training variance; the numerical floor is folded
    into ``s2_floor``). A noise with a floor per urban/rural class (``urban=True``) adds
    ``"s2_floor_urban"``; ``s2_floor`` is then the rural floor.
    """
    with torch.no_grad():
        if isinstance(noise, TestsNoise):
            out: dict[str, Any] = {
                "noise": "tests+devices" if noise.devices else "tests",
                "s2_floor": y_var * (noise.floor + float(noise.s2_floor)),
                "s2_meas": y_var * float(noise.s2_meas),
                "power": float(noise.power),
            }
            if noise.devices:
                out["s2_dev"] = y_var * float(noise.s2_dev)
                out["power_devices"] = float(noise.power_devices)
            if noise.urban:
                out["s2_floor_urban"] = y_var * (noise.floor + float(noise.s2_floor_urban))
            return out
        return {"noise": "constant", "s2": y_var * float(noise.variance())}
