"""Shared estimator machinery for the baselines that have their own torch implementation.

:class:`TorchBaseline` gives CaGP-Opt, SOLVE-GP, SoftKI and the exact RBF GP the same contract
as ``DBKRegressor`` (``docs/architecture.md``): a scikit-learn regressor (``BaseEstimator`` +
``RegressorMixin``: parameters from ``__init__``, ``score`` = R², ``NotFittedError``,
``n_features_in_`` / ``feature_names_in_``) with ``fit(X, y, X_val, y_val)``, ``predict(X)`` →
the predictive mean (``return_std=True``: and sd), ``predict_dist(X)`` →
:class:`geodbk.predictive.Prediction` (numpy float64, units of ``y``), ``kernel(X, X_ref)``,
``save(path, metadata=...)`` / ``load(path)`` (``weights.safetensors`` + ``model.json``, no
pickle), ``history_`` and ``best_epoch_``.

A subclass supplies the model as an ``nn.Module`` built from JSON-able sizes (so that ``load``
can rebuild it before reading the weights) and four functions: the per-datum training loss,
``refresh`` (recompute cached posterior quantities after the parameters changed), latent
prediction and the prior kernel. ``y`` is standardised inside (training mean/sd stored).

Observation noise (issue 9), as ``DBKRegressor``: ``noise="constant"`` (one learned ``s2``) or
``noise="tests"``, the core's :class:`~geodbk.likelihoods.TestsNoise`
``s2_i = s2_floor + s2_meas / tests_i^p`` (``p = 1``, or learned with ``noise_power=True``);
``fit(..., tests=, tests_val=)`` passes the per-row counts to the hooks and
``predict_dist(..., tests=, quantity=)`` gives ``var = var_f + s2(tests)`` (``quantity="observation"``,
``tests=None`` meaning a single speed test) or ``var = var_f`` (``quantity="latent"``).
The core's ``noise="tests+devices"`` is not available here (:data:`BASELINE_NOISE_MODELS`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from geodbk.bundle import load_bundle, save_bundle
from geodbk.device import resolve_device
from geodbk.errors import DataError, GeodbkError, ModelFileError
from geodbk.errors import TrainingDivergedError as TrainingDivergedError
from geodbk.estimator import QUANTITIES as QUANTITIES
from geodbk.estimator import BaseRegressor
from geodbk.hyperparameters import finite_at_least
from geodbk.likelihoods import GaussianNoise, TestsNoise, noise_parameters
from geodbk.objectives import gaussian_nll as core_gaussian_nll
from geodbk.predictive import Prediction, predict_in_chunks
from geodbk.sklearn_api import check_fitted, kept_on_failure, validated_X, validated_y
from geodbk.training import Epoch, fit, shuffled_batches
from geodbk.validation import as_tests

#: Version of the ``baseline`` section of ``model.json`` (inside the core's bundle format).
BUNDLE_VERSION = 1

T = TypeVar("T", bound="TorchBaseline")

#: Noise models of the torch baselines: the core's ``NOISE_MODELS`` less ``"tests+devices"``.
BASELINE_NOISE_MODELS = ("constant", "tests")


def check_noise(noise: str) -> str:
    """Return ``noise`` if the baselines support it, else raise a ``ValueError`` saying what works.

    ``"tests+devices"`` is refused with a pointer to ``DBKRegressor`` (the DBK family, SV-RBF,
    SV-DKL, PP-DKL and VBLL, which are ``DBKRegressor``s, take it).
    """
    if noise == "tests+devices":
        raise ValueError(
            'noise="tests+devices" is not supported by the torch baselines (CaGP, SOLVE-GP, '
            'SoftKI, exact RBF, SVDBK) yet; use noise="tests" or "constant", or a '
            'DBKRegressor(noise="tests+devices")'
        )
    if noise not in BASELINE_NOISE_MODELS:
        raise ValueError(f"noise must be one of {BASELINE_NOISE_MODELS}, got {noise!r}")
    return noise


#: Options a checkpoint need not match to be resumed: the budget and the device.
_BUDGET = ("epochs", "patience", "device")


class ProblemTooLargeError(GeodbkError, ValueError):
    """The data set is larger than a method's stated size limit (e.g. the exact GP)."""


def gaussian_nll(y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    """Mean Gaussian NLL: mean(0.5 log(2π var) + (y - mu)² / (2 var)) (the core's, averaged)."""
    return core_gaussian_nll(y, mean, var).mean()


def make_noise(noise: str, *, init: float, noise_power: bool = False) -> GaussianNoise | TestsNoise:
    """The core's noise module: ``GaussianNoise`` (``s2``) or ``TestsNoise``.

    ``noise="tests"``: ``s2_i = s2_floor + s2_meas / tests_i^p`` with ``init`` the variance of a
    single test (``tests = 1``), ``p = 1`` unless ``noise_power``.
    """
    if check_noise(noise) == "tests":
        return TestsNoise(init=init, learn_power=noise_power)
    return GaussianNoise(init=init)


@dataclass(kw_only=True, eq=False, repr=False)
class TorchBaseline(BaseRegressor):
    """Base estimator: standardisation, training loop, chunked prediction, safe bundles.

    A :class:`geodbk.estimator.BaseRegressor` (parameters are keyword-only dataclass fields,
    checked in :meth:`fit`): a subclass declares only its own, or re-declares a shared one to
    change its default.

    Parameters
    ----------
    epochs
        Passes over the training data (full-batch models: optimiser steps).
    batch_size
        Mini-batch size (ignored by full-batch models).
    lr
        Adam learning rate.
    patience
        Stop after this many epochs without a better validation NLL (``None``: never).
    seed
        Seeds torch (initialisation and shuffling).
    device
        ``"cpu"``, ``"cuda"`` or ``"auto"``.
    dtype
        ``"float32"`` or ``"float64"``.
    noise
        ``"constant"`` (homoscedastic ``s2``) or ``"tests"`` (per-row
        ``s2_i = s2_floor + s2_meas / tests_i^p``; :meth:`fit` then needs ``tests``).
    noise_power
        With ``noise="tests"``: learn the exponent ``p`` of ``tests`` (default ``p = 1``).
    """

    #: Registry name of the model (``"cagp"``, ...).
    model_name: ClassVar[str] = "baseline"
    #: Full-batch models take one optimiser step per epoch on all the data.
    full_batch: ClassVar[bool] = False
    fitted_attribute = "module_"

    epochs: int = 100
    batch_size: int = 1024
    lr: float = 0.01
    patience: int | None = 50
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    noise: str = "constant"
    noise_power: bool = False

    def _validate(self) -> None:
        """Check the options (:meth:`fit` does; scikit-learn sets them unchecked).

        ``epochs >= 0`` (0: initialise and compute the posterior without training),
        ``batch_size >= 1``, ``lr`` finite and ``>= 0``, ``patience`` ``None`` or ``>= 0`` (0: stop
        after the first epoch that does not improve),
        ``seed >= 0``, and the noise model and dtype; a ``ValueError`` names the option.
        """
        patience_ok = self.patience is None or finite_at_least(self.patience, 0)
        rules = [
            ("epochs", finite_at_least(self.epochs, 0), ">= 0"),
            ("batch_size", finite_at_least(self.batch_size, 1), ">= 1"),
            ("lr", finite_at_least(self.lr, 0), "a finite number >= 0"),
            ("patience", patience_ok, "None (never stop early) or >= 0"),
            ("seed", finite_at_least(self.seed, 0), ">= 0"),
        ]
        for name, good, rule in rules:
            if not good:
                raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")
        check_noise(self.noise)
        _ = self._torch_dtype  # "float32" or "float64"

    # ------------------------------------------------------------------ subclass hooks

    @property
    def tests_aware(self) -> bool:
        """Whether the noise depends on the number of tests (``noise="tests"``)."""
        return self._as_fitted().noise == "tests"

    def _sizes(self, X: Tensor, y: Tensor) -> dict[str, Any]:
        """JSON-able sizes that ``_make_module`` needs (n, d, rank, ...)."""
        raise NotImplementedError

    def _make_module(self, sizes: dict[str, Any]) -> nn.Module:
        """An uninitialised module of the given sizes (parameters are overwritten by ``load``)."""
        raise NotImplementedError

    def _init_module(self, module: nn.Module, X: Tensor, y: Tensor) -> None:
        """Data-dependent initialisation (inducing points, stored training inputs, ...)."""

    def _loss(
        self, module: nn.Module, X: Tensor, y: Tensor, n_total: int, tests: Tensor | None = None
    ) -> Tensor:
        """Per-datum negative objective on a batch (full-batch models: on all the data).

        ``tests``: the batch's test counts (``noise="tests"``), else ``None``.
        """
        raise NotImplementedError

    def _refresh(
        self, module: nn.Module, X: Tensor, y: Tensor, tests: Tensor | None = None
    ) -> None:
        """Recompute cached posterior quantities (buffers) after the parameters changed."""

    def _predict_latent(
        self, module: nn.Module, X: Tensor, tests: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Standardised-units ``(mean, var_f, noise_var)`` for a chunk of inputs.

        ``noise_var = s2(tests)``; ``tests=None`` means a single test for the tests-aware noise.
        """
        raise NotImplementedError

    def _noise(self, module: nn.Module) -> GaussianNoise | TestsNoise:
        """The module's observation-noise model (``module.noise`` unless overridden)."""
        noise = module.noise
        assert isinstance(noise, GaussianNoise | TestsNoise)
        return noise

    def _kernel(self, module: nn.Module, A: Tensor, B: Tensor) -> Tensor:
        """Prior kernel matrix k(A, B) in standardised units."""
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers
    @property
    def _torch_dtype(self) -> torch.dtype:
        dtype = self._as_fitted().dtype
        if dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {dtype!r}")
        return torch.float64 if dtype == "float64" else torch.float32

    @property
    def _torch_device(self) -> torch.device:
        return resolve_device(self.device)

    def _optimizer(self, module: nn.Module) -> torch.optim.Optimizer:
        """Adam on every parameter (subclasses may use parameter groups)."""
        return torch.optim.Adam(module.parameters(), lr=self.lr)

    def _scheduler(
        self, optimizer: torch.optim.Optimizer
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        """Learning-rate schedule stepped once after every epoch (``None``: constant rate).

        A ``ReduceLROnPlateau`` is stepped with the epoch's score (validation NLL, else
        training loss); any other scheduler with ``step()``.
        """
        del optimizer
        return None

    def _tensor(self, arr: np.ndarray) -> Tensor:
        return torch.as_tensor(arr, dtype=self._torch_dtype, device=self._torch_device)

    def _check_fitted(self) -> nn.Module:
        """The fitted module; :class:`sklearn.exceptions.NotFittedError` before fit/load."""
        check_fitted(self)
        module: nn.Module = self.module_
        return module

    def _val_nll(
        self,
        module: nn.Module,
        X: Tensor,
        y: Tensor,
        tests: Tensor | None = None,
        chunk_size: int = 8192,
    ) -> float:
        total = 0.0
        with torch.no_grad():
            for start in range(0, X.shape[0], chunk_size):
                tb = None if tests is None else tests[start : start + chunk_size]
                mean, var_f, noise = self._predict_latent(module, X[start : start + chunk_size], tb)
                var = var_f.clamp_min(0.0) + noise
                yb = y[start : start + chunk_size]
                total += float(gaussian_nll(yb, mean, var)) * yb.shape[0]
        return total / X.shape[0]

    # ------------------------------------------------------------------ public API
    @kept_on_failure
    def fit(
        self: T,
        X: Any,
        y: Any,
        X_val: Any = None,
        y_val: Any = None,
        *,
        progress: bool = False,
        callback: Callable[[dict[str, Any]], None] | None = None,
        tests: Any = None,
        tests_val: Any = None,
        checkpoint_dir: str | Path | None = None,
        resume: bool = False,
    ) -> T:
        """Train on ``(X, y)``; keep the epoch with the best validation NLL when given.

        Standardises ``y`` with its training mean/sd, then minimises the model's per-datum
        objective with the ``_optimizer`` (Adam; seeded shuffled mini-batches, or full batch)
        through :func:`geodbk.training.fit`: early stopping after ``patience`` epochs, NaN/inf
        loss raises :class:`TrainingDivergedError`.

        Parameters
        ----------
        X, y
            Training inputs (n, d) and targets (n,).
        X_val, y_val
            Optional validation data (the kept epoch has the lowest validation NLL).
        progress
            Show progress (a tqdm bar on a terminal, else a line per epoch on stderr).
        callback
            Called after every epoch with ``{"epoch", "train_loss", "val_nll", "seconds"}``.
        tests, tests_val
            Number of speed tests averaged in each training / validation row (``>= 1``): the
            covariate of ``s2_i = s2_floor + s2_meas / tests_i^p``. Required with
            ``noise="tests"`` (``tests_val`` too when validation data is given); ignored by
            the constant noise.
        checkpoint_dir, resume
            Write ``checkpoint_dir/last.pt`` after every epoch; with ``resume`` continue from
            it (same options, same result as an uninterrupted run).
        """
        self._record_fit_params()
        self._validate()
        Xn = validated_X(self, X, reset=True)
        yn = validated_y(self, y, Xn.shape[0])
        if Xn.shape[0] < 2:
            raise DataError(f"need at least 2 training points, got {Xn.shape[0]} sample")
        self.y_mean_ = float(yn.mean())
        self.y_sd_ = float(yn.std()) if yn.std() > 0 else 1.0
        seed, epochs, batch_size = int(self.seed), int(self.epochs), int(self.batch_size)
        torch.manual_seed(seed)
        Xt = self._tensor(Xn)
        yt = self._tensor((yn - self.y_mean_) / self.y_sd_)
        if (X_val is None) != (y_val is None):
            raise DataError("give both X_val and y_val, or neither")
        have_val = X_val is not None and y_val is not None
        aware = self.tests_aware
        if aware and tests is None:
            raise DataError('noise="tests" needs the number of tests per row: fit(..., tests=...)')
        Tt = self._tensor(as_tests(tests, "tests", Xn.shape[0])) if aware else None
        Tv: Tensor | None = None
        if have_val:
            Xv_np = validated_X(self, X_val, "X_val", reset=False)
            Xv = self._tensor(Xv_np)
            yv = self._tensor(
                (validated_y(self, y_val, Xv_np.shape[0], "y_val") - self.y_mean_) / self.y_sd_
            )
            if aware:
                if tests_val is None:
                    raise DataError('noise="tests" with validation data needs tests_val=...')
                Tv = self._tensor(as_tests(tests_val, "tests_val", Xv_np.shape[0]))
        self.sizes_ = self._sizes(Xt, yt)
        module = self._make_module(self.sizes_).to(
            device=self._torch_device, dtype=self._torch_dtype
        )
        with torch.no_grad():
            self._init_module(module, Xt, yt)
        self.module_ = module
        opt = self._optimizer(module)
        n, gen = Xt.shape[0], torch.Generator(device="cpu").manual_seed(seed)

        def epoch_step(epoch: int) -> Epoch | float:
            if self.full_batch:
                opt.zero_grad(set_to_none=True)
                loss = self._loss(module, Xt, yt, n, Tt)

                def step() -> None:  # after the loop scored and kept the current parameters,
                    loss.backward()  # whose posterior the forward pass cached
                    opt.step()

                return Epoch(float(loss.detach()), step)
            total = 0.0
            for idx in shuffled_batches(n, batch_size, gen):
                idx = idx.to(Xt.device)
                opt.zero_grad(set_to_none=True)
                loss = self._loss(module, Xt[idx], yt[idx], n, None if Tt is None else Tt[idx])
                if not torch.isfinite(loss):
                    return float(loss.detach())  # the loop raises TrainingDivergedError
                loss.backward()
                opt.step()
                total += float(loss.detach()) * idx.shape[0]
            return total / n

        def validate() -> float | None:
            if not self.full_batch:
                with torch.no_grad():
                    self._refresh(module, Xt, yt, Tt)
            return self._val_nll(module, Xv, yv, Tv) if have_val else None

        params = self.get_params(deep=False)
        result = fit(
            module,
            epoch_step,
            optimizer=opt,
            epochs=epochs,
            patience=self.patience,
            validate=validate,
            nll_offset=math.log(self.y_sd_),
            scheduler=self._scheduler(opt),
            checkpoint_dir=checkpoint_dir,
            resume=resume,
            options={
                "model": self.model_name,
                **{k: params[k] for k in params if k not in _BUDGET},
            },
            progress=progress,
            callback=callback,
            name=self.model_name,
            generator=gen,
        )
        self.history_, self.best_epoch_ = result.history, result.best_epoch or None
        self.metadata_: dict[str, Any] = {}
        with torch.no_grad():
            self._refresh(module, Xt, yt, Tt)
        return self

    def predict_dist(
        self,
        X: Any,
        *,
        tests: Any = None,
        quantity: str = "observation",
        chunk_size: int = 8192,
    ) -> Prediction:
        """Predictive distribution at ``X`` in the units of ``y`` (the core's ``Prediction``).

        ``mean = y_mean + y_sd mu(x)``, ``var_f = y_sd² var_f(x)`` and

        - ``quantity="observation"``: ``var = y_sd² (var_f + s2(x, tests))``, a new observation.
          Tests-aware noise: the tile average of ``tests`` speed tests,
          ``s2 = s2_floor + s2_meas / tests^p``; ``tests=None`` means **a single speed test**
          (``tests = 1``). Constant noise: ``s2`` whatever ``tests`` is.
        - ``quantity="latent"``: ``var = var_f`` (the latent mean ``f(x)``, no noise).

        Parameters
        ----------
        X
            Inputs (n, d): an array, a list of rows or a DataFrame with the columns of ``fit``.
        tests
            Number of tests the predicted value averages: a scalar or (n,) array (>= 1).
        quantity
            ``"observation"`` or ``"latent"``.
        chunk_size
            At most this many rows are processed at a time.
        """
        Xn, module = self._prediction_inputs(X, quantity), self._check_fitted()
        per_row = self.tests_aware and tests is not None
        if per_row:
            # The counts ride along as a last input column so that they are chunked with X.
            Xn = np.column_stack([Xn, as_tests(tests, "tests", Xn.shape[0])])

        def fn(xb: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            xq, tq = (xb[:, :-1], xb[:, -1]) if per_row else (xb, None)
            mean, var_f, noise = self._predict_latent(module, xq, tq)
            var_f = var_f.clamp_min(0.0)
            return mean, var_f, var_f + noise

        mean, var_f, var = predict_in_chunks(
            fn, Xn, chunk_size=chunk_size, device=self._torch_device, dtype=self._torch_dtype
        )
        sd2 = self.y_sd_**2
        if quantity == "latent":
            var = var_f
        return Prediction(mean=mean * self.y_sd_ + self.y_mean_, var=var * sd2, var_f=var_f * sd2)

    def noise_variance(self, tests: Any = None, *, n: int | None = None) -> np.ndarray:
        """Observation-noise variance in y's units, ``y_sd² s2_i``, float64 (n,).

        Constant noise: ``y_sd² s2`` (``tests`` ignored). Tests-aware noise:
        ``y_sd² (s2_floor + s2_meas / tests^p)``; ``tests=None`` means a single speed test.
        ``n`` broadcasts a scalar ``tests`` (default: ``len(tests)`` or 1). (SVDBK's test-time
        correction is not part of it: this is the learned noise model only.)
        """
        module = self._check_fitted()
        if tests is None or not self.tests_aware:
            size = n if n is not None else (1 if tests is None else int(np.size(tests)))
            t_np = np.ones(size)
        else:
            arr = np.asarray(tests, dtype=np.float64).reshape(-1)
            t_np = as_tests(arr, "tests", n if n is not None else arr.shape[0])
        with torch.no_grad():
            s2 = self._noise(module).variance(self._tensor(t_np) if self.tests_aware else None)
            out = s2.detach().to("cpu", torch.float64).numpy()
        return np.broadcast_to(out, t_np.shape).astype(np.float64) * self.y_sd_**2

    def noise_components(
        self, tests: Any = None, devices: Any = None, *, urban: Any = None, n: int | None = None
    ) -> tuple[tuple[str, ...], np.ndarray]:
        """The learned noise split into its terms, in y's units: ``(names, (n, k))``, as
        :meth:`geodbk.DBKRegressor.noise_components`.

        The columns sum to :meth:`noise_variance`: ``("noise",)`` for constant noise,
        ``("floor", "meas")`` for ``noise="tests"`` (``y_sd² s2_floor``, ``y_sd² s2_meas /
        tests^p``). The baselines take no ``devices`` or ``urban`` covariate (given ones are
        ignored, as by :meth:`noise_variance`). The tile effect (:mod:`geodbk.tile_effect`)
        rescales each term.
        """
        del devices, urban
        module = self._check_fitted()
        size = n if n is not None else (1 if tests is None else int(np.size(tests)))
        t_np = np.ones(size)
        if tests is not None and self.tests_aware:
            t_np = as_tests(np.asarray(tests, dtype=np.float64).reshape(-1), "tests", size)
        noise = self._noise(module)
        with torch.no_grad():
            cov = self._tensor(t_np) if self.tests_aware else None
            comp = noise.components(cov, n=size).detach().to("cpu", torch.float64).numpy()
        return tuple(noise.component_names), comp * self.y_sd_**2

    def noise_parameters(self) -> dict[str, Any]:
        """The learned noise in y's units (JSON-ready floats), as ``DBKRegressor``'s.

        ``{"noise": "constant", "s2": ...}`` or ``{"noise": "tests", "s2_floor": ...,
        "s2_meas": ..., "power": ...}`` with ``s2_i = s2_floor + s2_meas / tests_i^power`` (the
        variance floor is folded into ``s2_floor``).
        """
        return noise_parameters(self._noise(self._check_fitted()), y_var=self.y_sd_**2)

    def kernel(self, X: Any, X_ref: Any, *, in_y_units: bool = False) -> np.ndarray:
        """Prior kernel k(X, X_ref), (n, m) float64; standardised-target units like the core's
        ``DBKRegressor.kernel`` (``in_y_units=True`` multiplies by ``y_sd²``)."""
        module = self._check_fitted()
        with torch.no_grad():
            K = self._kernel(
                module,
                self._tensor(validated_X(self, X, reset=False)),
                self._tensor(validated_X(self, X_ref, "X_ref", reset=False)),
            )
        K_np = K.double().cpu().numpy()
        return K_np * self.y_sd_**2 if in_y_units else K_np

    # ------------------------------------------------------------------ bundles
    def save(self, path: str | Path, *, metadata: dict[str, Any] | None = None) -> Path:
        """Write the core's safe bundle (``weights.safetensors`` + ``model.json``, no pickle).

        ``model.json`` carries a ``baseline`` section (model name, class, constructor options,
        module sizes, standardisation, history) next to the core's checksum and tensor list.
        """
        module = self._check_fitted()
        meta = dict(metadata) if metadata is not None else dict(getattr(self, "metadata_", {}))
        doc: dict[str, Any] = {
            "baseline": {
                "version": BUNDLE_VERSION,
                "model": self.model_name,
                "class": type(self).__name__,
                "params": self._as_fitted().get_params(deep=False),
                "sizes": self.sizes_,
            },
            "standardization": {"y_mean": self.y_mean_, "y_std": self.y_sd_},
            "best_epoch": self.best_epoch_,
            "history": self.history_,
            "metadata": meta,
        }
        if hasattr(self, "n_features_in_"):
            doc["input_dim"] = int(self.n_features_in_)
        if hasattr(self, "feature_names_in_"):
            doc["feature_names"] = [str(c) for c in self.feature_names_in_]
        folder = save_bundle(path, tensors=dict(module.state_dict()), meta=doc)
        self.metadata_ = meta
        return folder

    @classmethod
    def load(cls: type[T], path: str | Path, *, device: str | None = None) -> T:
        """Rebuild an estimator saved with :meth:`save`; ``ModelFileError`` on bad files.

        ``device`` replaces the saved device option (default: keep it). Bundles written before
        the noise option (whose ``noise`` was the initial variance) load as constant noise;
        saved options that are no longer ``__init__`` parameters are ignored.
        """
        tensors, meta = load_bundle(path)
        info = meta.get("baseline")
        if not isinstance(info, dict) or info.get("model") != cls.model_name:
            found = info.get("model") if isinstance(info, dict) else "a DBKRegressor model"
            raise ModelFileError(
                f"{path} holds {found!r}, not a {cls.model_name!r} baseline; load it with the matching class"
            )
        if info.get("version") != BUNDLE_VERSION:
            raise ModelFileError(
                f"{path}: baseline section version {info.get('version')!r} is not supported (expected {BUNDLE_VERSION})"
            )
        try:
            params = dict(info["params"])
            if not isinstance(params.get("noise", "constant"), str):
                params["noise_init"] = params.pop("noise")  # before issue 9: the initial s2
            if device is not None:
                params["device"] = device
            est = cls(**{k: v for k, v in params.items() if k in cls._get_param_names()})
            est._validate()
            est._record_fit_params()
            est.sizes_ = dict(info["sizes"])
            est.y_mean_ = float(meta["standardization"]["y_mean"])
            est.y_sd_ = float(meta["standardization"]["y_std"])
            est.best_epoch_ = meta.get("best_epoch")
            est.history_ = list(meta.get("history", []))
            est.metadata_ = dict(meta.get("metadata") or {})
            if meta.get("input_dim") is not None:  # bundles from before issue 21 lack it
                est.n_features_in_ = int(meta["input_dim"])
            if meta.get("feature_names") is not None:
                est.feature_names_in_ = np.asarray(meta["feature_names"], dtype=object)
            module = est._make_module(est.sizes_).to(
                device=est._torch_device, dtype=est._torch_dtype
            )
            module.load_state_dict(tensors, strict=True)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ModelFileError(
                f"{path} is not a usable {cls.model_name} bundle ({type(exc).__name__}: {exc})"
            ) from exc
        module.eval()
        est.module_ = module
        return est
