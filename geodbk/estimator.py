"""``DBKRegressor``: the scikit-learn-style estimator around :class:`~geodbk.model.DBKModel`."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, overload

import numpy as np
import torch
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils import Tags

from geodbk.batches import InputFn, RowGroupSource, iter_groups, mean_std, stack_inputs
from geodbk.bundle import load_bundle, save_bundle
from geodbk.device import resolve_device
from geodbk.distributed import ShardPlan, global_mean_std
from geodbk.errors import DataError, ModelFileError
from geodbk.hyperparameters import DBKHyperparameters, finite_at_least
from geodbk.joint import JointSampler
from geodbk.likelihoods import NOISE_MODELS, noise_parameters
from geodbk.model import EXPANSIONS, DBKModel
from geodbk.posterior import FoldedWeights
from geodbk.predictive import Prediction, latent_change, predict_in_chunks
from geodbk.sklearn_api import (
    check_fitted,
    kept_on_failure,
    regressor_tags,
    validated_X,
    validated_y,
)
from geodbk.streaming import train_streaming
from geodbk.training import OBJECTIVES, LoopConfig, exact_posterior_from_data, train_model
from geodbk.validation import (
    as_devices,
    as_tests,
    as_urban_flags,
)

__all__ = ["QUANTITIES", "BaseRegressor", "DBKRegressor", "check_quantity"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64}
#: Defaults of options added after the first bundle format (old bundles lack them).
_LATER_DEFAULTS: dict[str, Any] = {
    "noise": "constant",
    "noise_power": False,
    "noise_urban": False,
    "kernel_update_every": 1,
}
#: :meth:`DBKRegressor.fit` warns when an input column's median ``|x|`` is above this.
UNSCALED_INPUT = 3.0
#: The quantities :meth:`DBKRegressor.predict_dist` can describe.
QUANTITIES = ("observation", "latent")


class BaseRegressor(RegressorMixin, BaseEstimator):
    """The scikit-learn regressor that ``DBKRegressor`` and the torch baselines
    (:class:`geodbk.baselines.base.TorchBaseline`) both are.

    The parameters are keyword-only dataclass fields declared by the subclasses: the generated
    ``__init__`` only stores them (scikit-learn reads them from its signature) and they are
    checked when fitting. Fitted attributes end in ``_`` and are not declared at class level. A
    subclass supplies :meth:`predict_dist`; :meth:`predict` is its mean (and sd).
    """

    #: The fitted attribute that holds the trained torch module.
    fitted_attribute: ClassVar[str] = "model_"

    def __sklearn_tags__(self) -> Tags:
        return regressor_tags(super().__sklearn_tags__())

    def __sklearn_is_fitted__(self) -> bool:
        """Fitted or loaded: the trained module is there (not just ``n_features_in_`` of a fit
        that failed)."""
        return hasattr(self, self.fitted_attribute)

    def _record_fit_params(self) -> None:
        """Record the parameters this fit uses (``fit_params_``): what :meth:`save` writes and
        what prediction reads, so that ``set_params`` after ``fit`` changes nothing until the
        next fit. An unfitted copy with them is kept for :meth:`_as_fitted`."""
        self.fit_params_ = self.get_params(deep=False)
        self._fitted_view = type(self)(**self.fit_params_)

    def _as_fitted(self) -> Any:
        """An unfitted estimator with the parameters the model was fitted with (``self`` before
        any fit)."""
        return self.__dict__.get("_fitted_view", self)

    def _prediction_inputs(self, X: Any, quantity: str) -> np.ndarray:
        """``X`` checked against the fitted inputs (their number and, for a DataFrame, names and
        order) once the model is fitted (else ``NotFittedError``) and ``quantity`` is known."""
        check_fitted(self)
        check_quantity(quantity)
        return validated_X(self, X, reset=False)

    if TYPE_CHECKING:
        #: The subclass's ``predict_dist(X, *, tests, [devices, urban,] quantity, chunk_size)``.
        predict_dist: Callable[..., Prediction]

    @overload
    def predict(
        self,
        X: Any,
        return_std: Literal[False] = ...,
        *,
        tests: Any = ...,
        devices: Any = ...,
        urban: Any = ...,
        chunk_size: int | None = ...,
    ) -> np.ndarray: ...

    @overload
    def predict(
        self,
        X: Any,
        return_std: Literal[True],
        *,
        tests: Any = ...,
        devices: Any = ...,
        urban: Any = ...,
        chunk_size: int | None = ...,
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def predict(
        self,
        X: Any,
        return_std: bool = False,
        *,
        tests: Any = None,
        devices: Any = None,
        urban: Any = None,
        chunk_size: int | None = None,
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Predictive mean at ``X`` (n, d) in y's units: float64 (n,), ``predict_dist(X).mean``.

        With ``return_std=True`` returns ``(mean, std)``, where ``std`` is the predictive
        standard deviation **of a new observation, noise included**:
        ``std = sqrt(var_f + y_sd^2 s2(tests))``, the ``std`` of
        ``predict_dist(X, tests=tests, devices=devices, urban=urban)`` (``quantity=
        "observation"``; the latent sd without noise is ``predict_dist(X,
        quantity="latent").std`` or ``.std_f``). For a tests-aware noise ``tests=None`` means a
        single speed test; ``tests``, ``devices`` and ``urban`` are as in :meth:`predict_dist`
        and used only with ``return_std=True`` (the mean does not depend on them).

        Parameters
        ----------
        X
            Inputs (n, d): an array, a list of rows or a DataFrame with the columns of ``fit``.
        return_std
            Also return the predictive sd.
        tests, devices, urban
            Noise covariates of the predicted observations (see :meth:`predict_dist`; the torch
            baselines take only ``tests``).
        chunk_size
            At most this many rows are processed at a time (default: ``predict_dist``'s).

        Returns
        -------
        numpy.ndarray or tuple of numpy.ndarray
            ``mean`` (n,), or ``(mean, std)`` with ``return_std=True``.
        """
        size = {} if chunk_size is None else {"chunk_size": chunk_size}  # else predict_dist's
        if not return_std:
            # The mean is the same for both quantities; "latent" needs no noise covariates.
            return self.predict_dist(X, quantity="latent", **size).mean
        # The covariates given (the torch baselines take only ``tests``).
        given = {"tests": tests, "devices": devices, "urban": urban}
        covariates = {k: v for k, v in given.items() if v is not None}
        pred = self.predict_dist(X, quantity="observation", **covariates, **size)
        return pred.mean, pred.std


def check_quantity(quantity: str) -> str:
    """Return ``quantity`` if it is one of :data:`QUANTITIES`, else raise ``ValueError``."""
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity must be one of {QUANTITIES}, got {quantity!r}")
    return quantity


@dataclass(kw_only=True, eq=False, repr=False)
class DBKRegressor(BaseRegressor, DBKHyperparameters):
    """Deep basis kernel GP regressor (methods §1), a scikit-learn estimator.

    ``f(x) = c + w' phi(x)`` with ``phi = expansion ∘ backbone`` and ``y = f(x) + eps``,
    ``eps ~ N(0, s2)`` (``noise="constant"``) or ``eps_i ~ N(0, s2_i)`` with
    ``s2_i = s2_floor + s2_meas / tests_i^p`` (``noise="tests"``: ``y_i`` is the average of
    ``tests_i`` speed tests; ``fit(..., tests=...)``) or
    ``s2_i = s2_floor + s2_meas / tests_i^p + s2_dev / devices_i^q`` (``noise="tests+devices"``:
    the tests come from ``devices_i`` distinct devices; ``fit(..., tests=..., devices=...)``);
    trained with dPPGP (default), the exact marginal likelihood, PPGP or the ELBO. Targets are standardised internally; predictions are returned in y's units.

    A scikit-learn regressor (``BaseEstimator`` + ``RegressorMixin``): the parameters are those
    of ``__init__`` (``get_params`` / ``set_params`` / ``clone``), :meth:`predict` returns the
    predictive mean (``return_std=True``: and sd) as numpy arrays, ``score`` is R², an unfitted
    model raises :class:`sklearn.exceptions.NotFittedError`, and ``n_features_in_`` (and, when
    fitted on a DataFrame, ``feature_names_in_``) are checked at prediction time, so it works in
    ``make_pipeline``, ``cross_val_score`` and ``GridSearchCV``. The full predictive
    distribution is :meth:`predict_dist`. Options are checked when fitting, not when set.
    The parameters shared with ``geodbk train``'s config, and their defaults, are declared in
    :class:`~geodbk.hyperparameters.DBKHyperparameters`.

    Parameters
    ----------
    expansion
        ``"rbf"`` (DBK-RBF, whitened inducing-point basis) or ``"silu"`` (DBK-SiLU).
    rank
        Number of basis functions ``r``.
    hidden
        Backbone width ``h``.
    objective
        ``"dppgp"``, ``"exact"`` (full-batch exact marginal likelihood, exact posterior),
        ``"ppgp"`` or ``"elbo"``. PPGP and ELBO with the RBF basis add the base-kernel variance
        correction ``k~(x,x) - ||phi(x)||^2`` at training and prediction time.
    alpha, beta
        dPPGP trace-regulariser and KL weights (``beta`` is also PPGP's KL weight).
    batch_size, epochs, lr, weight_decay, patience
        AdamW options (weight decay on the backbone only) and early-stopping patience.
    device
        ``"auto"``, ``"cpu"`` or ``"cuda"`` (falls back to the CPU with a warning).
    seed
        Seeds the initialisation and the mini-batch order.
    kernel_update_every
        With the RBF basis and a mini-batch objective: the inducing points and the base
        kernel take a gradient step on every ``kernel_update_every``-th mini-batch of an
        epoch, the first included; on the others they are held and ``Kzz``'s Cholesky
        factor is reused, which makes those steps cheaper. ``1``: every step. ``0``
        (default): 4 with the RBF basis and dPPGP (the same test NLL on Hawaii, a quarter
        less time per step: docs/decisions/defaults.md), else 1.
    jitter
        Relative Cholesky jitter of the RBF basis.
    dtype
        ``"float32"`` or ``"float64"``.
    noise_init, noise_floor
        Initial noise variance (of a single test for ``noise="tests"``) and its floor, in
        standardised units.
    noise
        ``"constant"`` (homoscedastic ``s2``), ``"tests"`` (per-point
        ``s2_i = s2_floor + s2_meas / tests_i^p``, both terms learned and positive; needs the
        ``tests`` covariate in :meth:`fit`) or ``"tests+devices"`` (per-point
        ``s2_i = s2_floor + s2_meas / tests_i^p + s2_dev / devices_i^q``, ``s2_dev`` learned and
        positive, initialised at ``0.25 * noise_init``; needs ``tests`` and ``devices`` in
        :meth:`fit`; not with :meth:`fit_batches`).
    noise_power
        With the tests-aware noise: learn the exponents ``p`` of ``tests`` and ``q`` of
        ``devices`` (default ``p = q = 1``).
    noise_urban
        With the tests-aware noise: learn a separate floor for urban tiles,
        ``s2_floor(u_i) = (1 - u_i) s2_floor + u_i s2_floor_urban`` (``u_i`` = 1 urban, 0 rural;
        ``s2_floor`` is then the rural floor); needs ``urban`` in :meth:`fit` and
        :meth:`predict_dist` (not with :meth:`fit_batches`).
    """

    # the others, and every default, are those of DBKHyperparameters
    jitter: float = 1e-4
    dtype: str = "float32"
    noise_floor: float = 1e-6
    noise_urban: bool = False

    # ------------------------------------------------------------------ configuration
    def out_of_range(self) -> list[tuple[str, str]]:
        """:meth:`DBKHyperparameters.out_of_range`, and the estimator's own ``jitter`` and
        ``noise_floor`` (finite, ``>= 0``)."""
        own = [
            (name, "a finite number >= 0")
            for name in ("jitter", "noise_floor")
            if not finite_at_least(getattr(self, name), 0)
        ]
        return [*super().out_of_range(), *own]

    def _validate(self) -> None:
        if self.expansion not in EXPANSIONS:
            raise ValueError(f"expansion must be one of {EXPANSIONS}, got {self.expansion!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {tuple(_DTYPES)}, got {self.dtype!r}")
        for name, rule in self.out_of_range():
            raise ValueError(f"{name} must be {rule}, got {getattr(self, name)!r}")
        if not self.kernel_update_every_allowed():
            raise ValueError(
                "kernel_update_every must be 0 (default) or 1 with expansion='silu' (no kernel "
                "to hold) or objective='exact' (one full-batch step per epoch), and >= 0; got "
                f"{self.kernel_update_every!r}"
            )
        if self.noise not in NOISE_MODELS:
            raise ValueError(f"noise must be one of {NOISE_MODELS}, got {self.noise!r}")
        if self.noise_urban and not self.tests_aware:
            raise ValueError(
                'noise_urban (a noise floor per urban/rural class) needs noise="tests" or '
                f'"tests+devices", got noise={self.noise!r}'
            )

    def _build_model(self, input_dim: int, device: torch.device) -> DBKModel:
        """The untrained model (:meth:`_make_model`, seeded by ``seed``) on ``device``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(self.seed))
            model = self._make_model(input_dim, torch.Generator().manual_seed(int(self.seed)))
        return model.to(device=device, dtype=_DTYPES[self.dtype])

    def _make_model(self, input_dim: int, generator: torch.Generator, **changes: Any) -> DBKModel:
        """A :class:`DBKModel` with the estimator's options (``changes`` replace some)."""
        options = {
            "expansion": self.expansion,
            "rank": int(self.rank),
            "hidden": int(self.hidden),
            "jitter": float(self.jitter),
            "noise_init": float(self.noise_init),
            "noise_floor": float(self.noise_floor),
            "noise": str(self.noise),
            "noise_power": bool(self.noise_power),
            "noise_urban": bool(self.noise_urban),
        }
        return DBKModel(input_dim, **{**options, **changes}, generator=generator)

    def _check_fitted(self) -> DBKModel:
        """The fitted model; :class:`sklearn.exceptions.NotFittedError` before fit/load."""
        check_fitted(self)
        model: DBKModel = self.model_
        return model

    @property
    def _fitted_dtype(self) -> torch.dtype:
        return _DTYPES[self._as_fitted().dtype]

    def _to_tensor(self, arr: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(arr, dtype=self._fitted_dtype, device=self.device_)

    # ------------------------------------------------------------------ fitting
    @kept_on_failure
    def fit(
        self,
        X: Any,
        y: Any,
        X_val: Any = None,
        y_val: Any = None,
        *,
        checkpoint_dir: str | Path | None = None,
        resume: bool = False,
        progress: bool = False,
        callback: Callable[[dict[str, Any]], None] | None = None,
        tests: Any = None,
        tests_val: Any = None,
        devices: Any = None,
        devices_val: Any = None,
        urban: Any = None,
        urban_val: Any = None,
        shards: ShardPlan | None = None,
    ) -> DBKRegressor:
        """Fit the model to ``X`` (n, d) and ``y`` (n,).

        Parameters
        ----------
        X, y
            Training inputs and targets. The inputs should be of about unit scale, e.g. in
            ``[-1, 1]`` (the inducing points start there); a column lying mostly beyond ±3 is
            warned about.
        X_val, y_val
            Optional validation data; the returned model is the epoch with the lowest
            validation NLL (without them: the lowest training loss).
        checkpoint_dir
            Folder for per-epoch checkpoints (``last.pt``).
        resume
            Continue a killed run from ``checkpoint_dir`` (bit-identical to an uninterrupted
            run on the same device and thread count).
        progress
            Show a tqdm progress bar (training loss, validation NLL).
        callback
            Called after every epoch with ``{"epoch", "train_loss", "val_nll", "seconds"}``.
        tests, tests_val
            Noise covariate: number of speed tests averaged in each training / validation row
            (``>= 1``). Required with ``noise="tests"`` (``tests_val`` too when validation data
            is given); ignored by the constant noise.
        devices, devices_val
            Second noise covariate: number of distinct devices behind each training /
            validation row (``>= 1``; ``devices <= tests`` is not required). Required with
            ``noise="tests+devices"`` (``devices_val`` too with validation data); ignored by the
            other noise models.
        urban, urban_val
            Whether each training / validation row is urban (bool or 0/1). Required with
            ``noise_urban=True`` (``urban_val`` too with validation data); ignored otherwise.
        shards
            Data-parallel training (:mod:`geodbk.distributed`): ``X, y`` (and ``tests``) are
            this rank's shard; the target standardisation uses the mean and sd over all ranks.

        Returns
        -------
        DBKRegressor
            ``self``.
        """
        self._record_fit_params()
        self._validate()
        x_np = validated_X(self, X, reset=True)
        y_np = validated_y(self, y, x_np.shape[0])
        if x_np.shape[0] < 2:
            raise DataError(f"need at least 2 training points, got {x_np.shape[0]} sample")
        self._warn_if_unscaled(x_np)
        has_val = X_val is not None and y_val is not None
        if (X_val is None) != (y_val is None):
            raise DataError("give both X_val and y_val, or neither")
        self.device_ = resolve_device(self.device)
        self.y_mean_, sd = float(y_np.mean()), float(y_np.std())
        if shards is not None:
            self.y_mean_, sd, _ = global_mean_std(y_np)
        self.y_std_ = sd if sd > 0 and math.isfinite(sd) else 1.0
        self.model_ = self._build_model(self.n_features_in_, self.device_)
        x_t = self._to_tensor(x_np)
        y_t = self._to_tensor((y_np - self.y_mean_) / self.y_std_)
        t_t = self._covariate(tests, devices, urban, x_np.shape[0])
        xv_t, yv_t, tv_t = (None, None, None)
        if has_val:
            xv_t, yv_t, tv_t = self._validation_tensors(
                X_val, y_val, tests_val, devices_val, urban_val
            )
        result = train_model(
            self.model_,
            x_t,
            y_t,
            config=LoopConfig.of(self),
            x_val=xv_t,
            y_val=yv_t,
            nll_offset=math.log(self.y_std_),
            checkpoint_dir=checkpoint_dir,
            resume=resume,
            progress=progress,
            callback=callback,
            tests=t_t,
            tests_val=tv_t,
            shards=shards,
        )
        if self.objective == "exact":
            exact_posterior_from_data(self.model_, x_t, y_t, tests=t_t)
        self.history_ = result.history
        self.best_epoch_ = result.best_epoch
        self.stopped_early_ = result.stopped_early
        self.metadata_: dict[str, Any] = {}
        self._fold()
        return self

    def _warn_if_unscaled(self, x_np: np.ndarray) -> None:
        """Warn when an input column lies mostly beyond ±:data:`UNSCALED_INPUT` (its median
        ``|x|``): the inducing points start in ``[-1, 1]`` and the backbone expects inputs of
        about that size, so raw coordinates (lon/lat in degrees) leave the model fitting a
        constant."""
        median = np.median(np.abs(x_np), axis=0)
        far = np.flatnonzero(median > UNSCALED_INPUT)
        if not far.size:
            return
        names = getattr(self, "feature_names_in_", None)
        cols = ", ".join(f"{names[j]!r}" if names is not None else str(j) for j in far)
        warnings.warn(
            f"X column {cols} lies mostly beyond ±{UNSCALED_INPUT:g} (median |x| "
            f"{float(median[far].max()):.3g}), but {type(self).__name__} starts its inducing "
            "points in [-1, 1] and expects inputs of about that scale: it may fit a constant. "
            "Scale X to [-1, 1] first, e.g. make_pipeline(MinMaxScaler(feature_range=(-1, 1)), "
            "model) (geodbk ingest writes lon/lat scaled so, as x1 and x2)",
            UserWarning,
            stacklevel=4,  # the caller of fit (through kept_on_failure's wrapper)
        )

    def _covariate(
        self, tests: Any, devices: Any, urban: Any, n: int, *, suffix: str = ""
    ) -> torch.Tensor | None:
        """The noise covariate of ``n`` fitted rows, checked (``suffix``: ``"_val"`` for the
        validation rows): ``None`` (constant noise), ``tests`` (n,), or the (n, k) columns
        ``tests``, ``devices`` (``noise="tests+devices"``), ``urban`` (``noise_urban``)."""
        if not self.tests_aware:
            return None
        if tests is None:
            raise DataError(
                f'noise="{self.noise}" needs the number of tests per row: '
                f"fit(..., tests{suffix}=...)"
            )
        columns = [as_tests(tests, f"tests{suffix}", n)]
        if self.devices_aware:
            if devices is None:
                raise DataError(
                    f'noise="tests+devices" needs the number of distinct devices per row: '
                    f"fit(..., devices{suffix}=...)"
                )
            columns.append(as_devices(devices, f"devices{suffix}", n))
        if self._as_fitted().noise_urban:
            if urban is None:
                raise DataError(
                    "noise_urban=True (a noise floor per urban/rural class) needs each row's "
                    f"class: fit(..., urban{suffix}=...)"
                )
            columns.append(as_urban_flags(urban, f"urban{suffix}", n))
        return self._to_tensor(columns[0] if len(columns) == 1 else np.column_stack(columns))

    def _validation_tensors(
        self, X_val: Any, y_val: Any, tests_val: Any, devices_val: Any = None, urban_val: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Checked validation inputs, standardised targets and noise covariate as tensors."""
        xv_np = self._check_input(X_val, "X_val")
        yv_np = validated_y(self, y_val, xv_np.shape[0], "y_val")
        tv_t = self._covariate(tests_val, devices_val, urban_val, xv_np.shape[0], suffix="_val")
        return (
            self._to_tensor(xv_np),
            self._to_tensor((yv_np - self.y_mean_) / self.y_std_),
            tv_t,
        )

    @kept_on_failure
    def fit_batches(
        self,
        source: RowGroupSource,
        *,
        y_column: str,
        x_columns: tuple[str, ...] = ("x1", "x2"),
        inputs: InputFn | None = None,
        read_columns: tuple[str, ...] = (),
        tests_column: str | None = None,
        X_val: Any = None,
        y_val: Any = None,
        tests_val: Any = None,
        checkpoint_dir: str | Path | None = None,
        resume: bool = False,
        progress: bool = False,
        callback: Callable[[dict[str, Any]], None] | None = None,
    ) -> DBKRegressor:
        """Fit on the rows of a table read a row group at a time (out of core).

        Memory is bounded by one shuffle window of row groups plus the model: one pass over
        ``source``'s groups computes the target's mean and sd (:func:`geodbk.batches.mean_std`),
        then :func:`geodbk.streaming.train_streaming` trains with each epoch visiting the row
        groups in a seeded order and shuffling rows within a window. The objective, selection
        by validation NLL, early stopping, checkpoints and ``resume`` are those of :meth:`fit`
        (mini-batch objectives only: ``exact`` needs the whole data set at once). For a parquet
        file: :func:`geodbk.geo.parquet_batches.fit_parquet`.

        Parameters
        ----------
        source
            The training rows (a :class:`geodbk.batches.RowGroupSource`, e.g.
            :class:`geodbk.batches.ArrayRowGroups` or
            :class:`geodbk.geo.parquet_batches.ParquetRowGroups`).
        y_column
            Target column.
        x_columns, inputs, read_columns
            Input columns, or a map from a batch's columns to the inputs (e.g. adding the
            time input from ``quarter``) and the extra columns it reads.
        tests_column
            Per-row number of tests (required with ``noise="tests"``).
        X_val, y_val, tests_val
            Validation data, held in memory.
        checkpoint_dir, resume, progress, callback
            As in :meth:`fit`.
        """

        self._record_fit_params()
        self._validate()
        if self.objective == "exact":
            raise DataError(
                'objective="exact" needs the whole training set in memory; use fit() or a '
                "mini-batch objective (dppgp, ppgp, elbo) for out-of-core training"
            )
        if self.devices_aware or self._as_fitted().noise_urban:
            raise DataError(
                'noise="tests+devices" and noise_urban are not supported by out-of-core training '
                "(fit_batches, geodbk.geo.parquet_batches.fit_parquet) yet; use fit() with "
                'tests=, devices= and urban=, or noise="tests" with tests_column='
            )
        aware = self.noise == "tests"
        if aware and tests_column is None:
            raise DataError('noise="tests" needs tests_column= (the number of tests per row)')
        mean, sd, n = mean_std(b[y_column] for b in iter_groups(source, [y_column]))
        if n < 2:
            raise DataError(f"{source}: need at least 2 finite {y_column!r} rows, got {n}")
        self.device_ = resolve_device(self.device)
        self.y_mean_ = mean
        self.y_std_ = sd if sd > 0 and math.isfinite(sd) else 1.0
        cols = list(dict.fromkeys([*x_columns, *read_columns]))
        probe = next((b for b in iter_groups(source, cols) if len(b[cols[0]])), None)
        if probe is None:
            raise DataError(f"{source}: no rows match the filter")
        to_x = inputs or stack_inputs(x_columns)
        self.n_features_in_ = int(np.asarray(to_x(probe)).shape[1])
        if hasattr(self, "feature_names_in_"):  # from an earlier fit on a DataFrame
            del self.feature_names_in_
        self.model_ = self._build_model(self.n_features_in_, self.device_)
        xv_t, yv_t, tv_t = (None, None, None)
        if X_val is not None and y_val is not None:
            xv_t, yv_t, tv_t = self._validation_tensors(X_val, y_val, tests_val)
        history = train_streaming(
            self.model_,
            source,
            x_columns=list(x_columns),
            y_column=y_column,
            y_mean=self.y_mean_,
            y_std=self.y_std_,
            config=LoopConfig.of(self),
            x_val=xv_t,
            y_val=yv_t,
            n_global=source.count_rows(),
            dtype=self._fitted_dtype,
            inputs=inputs,
            read_columns=list(read_columns),
            tests_column=tests_column if aware else None,
            tests_val=tv_t,
            checkpoint_dir=checkpoint_dir,
            resume=resume,
            progress=progress,
            callback=callback,
        )
        self.history_ = history
        scores = [
            (h["val_nll"] if h["val_nll"] is not None else h["train_loss"], h["epoch"])
            for h in history
        ]
        self.best_epoch_ = int(min(scores)[1]) if scores else 0
        self.stopped_early_ = len(history) < int(self.epochs)
        self.metadata_ = {}
        self._fold()
        return self

    # ------------------------------------------------------------------ prediction
    def _fold(self) -> None:
        """Fold the fitted weights for prediction (:meth:`DBKModel.fold`) once, after fit/load,
        so that predicting does not change the estimator."""
        self._folded = self.model_.fold(variance_correction=self._as_fitted().variance_correction)

    def _folded_weights(self) -> FoldedWeights:
        model = self._check_fitted()
        folded: FoldedWeights | None = getattr(self, "_folded", None)
        if folded is None:
            folded = self._folded = model.fold(
                variance_correction=self._as_fitted().variance_correction
            )
        return folded

    def _check_input(self, X: Any, name: str = "X") -> np.ndarray:
        """``X`` checked against the fitted inputs: the number of columns and, for a DataFrame,
        their names and order (``feature_names_in_``)."""
        return validated_X(self, X, name, reset=False)

    @property
    def tests_aware(self) -> bool:
        """Whether the noise depends on the number of tests (``"tests"``, ``"tests+devices"``)."""
        return self._as_fitted().noise in ("tests", "tests+devices")

    @property
    def devices_aware(self) -> bool:
        """Whether the noise also depends on the number of devices (``"tests+devices"``)."""
        return self._as_fitted().noise == "tests+devices"

    def noise_variance(
        self, tests: Any = None, devices: Any = None, *, urban: Any = None, n: int | None = None
    ) -> np.ndarray:
        """Observation-noise variance in y's units, ``y_sd^2 s2_i``, float64 (n,).

        Constant noise: ``y_sd^2 s2`` (``tests``, ``devices`` ignored). ``noise="tests"``:
        ``y_sd^2 (s2_floor + s2_meas / tests^p)`` (``devices`` ignored). ``"tests+devices"``:
        ``y_sd^2 (s2_floor + s2_meas / tests^p + s2_dev / devices^q)`` with
        ``devices=None`` meaning ``devices = tests`` (each test from its own device).
        ``tests=None`` means a single speed test (``tests = 1``). With ``noise_urban`` the floor
        is ``s2_floor_urban`` where ``urban`` is true and ``s2_floor`` elsewhere; ``urban`` is
        then required. ``n`` broadcasts scalars (default: the length of ``tests``, else of
        ``devices``, else of ``urban``, else 1).
        """
        cov, size = self._noise_covariate(tests, devices, urban=urban, n=n)
        model = self._check_fitted()
        with torch.no_grad():
            s2 = model.noise_var(cov)
            out = s2.detach().to("cpu", torch.float64).numpy()
        return np.broadcast_to(out, (size,)).astype(np.float64) * self.y_std_**2

    def noise_components(
        self, tests: Any = None, devices: Any = None, *, urban: Any = None, n: int | None = None
    ) -> tuple[tuple[str, ...], np.ndarray]:
        """The observation noise split into its terms, in y's units: ``(names, (n, k))``.

        The columns sum to :meth:`noise_variance` (same arguments): ``("noise",)`` for constant
        noise, ``("floor", "meas")`` for ``noise="tests"`` (``y_sd^2 s2_floor`` or the row's
        class floor, ``y_sd^2 s2_meas / tests^p``) and ``("floor", "meas", "dev")`` for
        ``"tests+devices"`` (adds ``y_sd^2 s2_dev / devices^q``). The tile effect
        (:mod:`geodbk.tile_effect`) rescales each term.
        """
        cov, size = self._noise_covariate(tests, devices, urban=urban, n=n)
        noise = self._check_fitted().noise
        with torch.no_grad():
            comp = noise.components(cov, n=size).detach().to("cpu", torch.float64).numpy()
        return tuple(noise.component_names), comp * self.y_std_**2

    def _noise_covariate(
        self, tests: Any, devices: Any, *, urban: Any, n: int | None
    ) -> tuple[torch.Tensor | None, int]:
        """The noise module's covariate tensor (None for constant noise) and the row count."""
        self._check_fitted()
        given = [tests] + ([devices] if self.devices_aware else [])
        given += [urban] if self._as_fitted().noise_urban else []
        sizes = [int(np.size(g)) for g in given if g is not None]
        size = n if n is not None else (sizes[0] if sizes else 1)
        cov = np.ones(size)
        if self.tests_aware and tests is not None:
            cov = as_tests(tests, "tests", size)
        if self.devices_aware:
            dev = cov if devices is None else as_devices(devices, "devices", size)
            cov = np.column_stack([cov, dev])
        if self._as_fitted().noise_urban:
            if urban is None:
                raise DataError(
                    "this model has a noise floor per urban/rural class: give urban= (True for "
                    "an urban tile) to get the observation noise"
                )
            cov = np.column_stack([cov, as_urban_flags(urban, "urban", size)])
        if not self.tests_aware:
            return None, size
        return torch.as_tensor(cov, dtype=self._fitted_dtype, device=self.device_), size

    def noise_parameters(self) -> dict[str, Any]:
        """The learned noise in y's units (JSON-ready floats).

        ``{"noise": "constant", "s2": ...}``, ``{"noise": "tests", "s2_floor": ...,
        "s2_meas": ..., "power": ...}`` with ``s2_i = s2_floor + s2_meas / tests_i^power``, or
        for ``"tests+devices"`` the same plus ``"s2_dev"`` and ``"power_devices"``
        (``+ s2_dev / devices_i^power_devices``); the variance floor is folded into
        ``s2_floor``.
        """
        return noise_parameters(self._check_fitted().noise, y_var=self.y_std_**2)

    def predict_dist(
        self,
        X: Any,
        *,
        tests: Any = None,
        devices: Any = None,
        urban: Any = None,
        quantity: str = "observation",
        chunk_size: int = 65536,
    ) -> Prediction:
        """Predictive distribution at ``X`` (n, d), in y's units (a :class:`Prediction`).

        ``mean = y_mean + y_sd (u'a + c)``, ``var_f = y_sd^2 ||B'u||^2`` with
        ``u = raw_features(g(x))`` and the folded weights ``a, B`` (see
        :meth:`DBKModel.predict_folded`), and

        - ``quantity="observation"``: ``var = var_f + y_sd^2 s2(tests)``, the distribution of a
          new observation. Tests-aware noise: the tile average of ``tests`` speed tests
          (``s2 = s2_floor + s2_meas / tests^p``); ``tests=None`` means **a single speed test**
          (``tests = 1``). ``noise="tests+devices"``: ``s2`` adds ``s2_dev / devices^q``, the
          tests taken on ``devices`` distinct devices (``devices=None``: ``devices = tests``).
          ``noise_urban``: the floor of ``s2`` is that of the row's urban/rural class (``urban``
          required). Constant noise: ``s2`` whatever ``tests`` is.
        - ``quantity="latent"``: ``var = var_f``, the latent mean speed ``f(x)`` (no noise).

        Parameters
        ----------
        X
            Inputs (n, d): an array, a list of rows or a DataFrame with the columns of ``fit``.
        tests
            Number of tests the predicted tile value averages: a scalar or (n,) array (>= 1).
        devices
            Number of distinct devices behind those tests (``noise="tests+devices"`` only): a
            scalar or (n,) array (>= 1); default ``devices = tests``.
        urban
            Whether each row is urban (bool, scalar or (n,); ``noise_urban`` models only, where
            the observation quantity needs it).
        quantity
            ``"observation"`` or ``"latent"``.
        chunk_size
            At most this many rows are processed at a time.
        """
        x_np = self._prediction_inputs(X, quantity)
        model, folded = self._check_fitted(), self._folded_weights()
        mean, var_f = predict_in_chunks(
            lambda xb: model.latent_folded(xb, folded),
            x_np,
            chunk_size=chunk_size,
            device=self.device_,
            dtype=self._fitted_dtype,
            width=int(self._as_fitted().rank),
        )
        v = self.y_std_**2
        var_f = v * var_f
        if quantity == "latent":
            var = var_f.copy()
        else:
            var = var_f + self.noise_variance(tests, devices, urban=urban, n=x_np.shape[0])
        return Prediction(mean=self.y_mean_ + self.y_std_ * mean, var=var, var_f=var_f)

    def predict_change(
        self, X_from: Any, X_to: Any, *, chunk_size: int = 65536
    ) -> tuple[np.ndarray, np.ndarray]:
        """Latent change ``f(X_to) - f(X_from)`` row by row, from the joint posterior.

        ``mean = y_sd m'(phi_to - phi_from)`` (the constant mean cancels) and
        ``var = y_sd^2 ||L'(phi_to - phi_from)||^2`` with ``q(w) = N(m, LL')`` (the exact
        posterior for ``objective="exact"``), evaluated with the same folded weights as
        :meth:`predict_dist`; the variance-corrected objectives (PPGP/ELBO with the RBF basis) add
        the residual process, so ``var = var_f(a) + var_f(b) - 2 cov(f(a), f(b))`` with
        ``var_f`` of :meth:`predict_dist` (see :func:`geodbk.predictive.change_moments`). Noise is
        excluded: this is the change of the latent mean, e.g. between two quarters at the same
        place for a time-aware model.

        Parameters
        ----------
        X_from, X_to
            Inputs (n, d) each; row i of ``X_to`` is compared with row i of ``X_from``.
        chunk_size
            At most this many row pairs are processed at a time.

        Returns
        -------
        tuple of numpy.ndarray
            ``(mean, var)``, float64 (n,) each, in y's units (and y's units squared).
        """
        model = self._check_fitted()
        xa = self._check_input(X_from, "X_from")
        xb = self._check_input(X_to, "X_to")
        if xa.shape[0] != xb.shape[0]:
            raise DataError(
                f"X_from has {xa.shape[0]} rows but X_to has {xb.shape[0]}; give row pairs"
            )
        folded = self._folded_weights()
        d = xa.shape[1]
        mean, var = predict_in_chunks(
            lambda xab: latent_change(model, folded, xab[:, :d], xab[:, d:]),
            np.hstack([xa, xb]),
            chunk_size=chunk_size,
            device=self.device_,
            dtype=self._fitted_dtype,
            width=int(self._as_fitted().rank),
        )
        return self.y_std_ * mean, self.y_std_**2 * var

    def latent_draws(self, X: Any, eps: Any, *, chunk_size: int = 8192) -> Any:
        """Joint posterior draws of the latent f at ``X`` (n, d) from the weight draws ``eps``
        (r, S): :class:`geodbk.joint.LatentDraws` with the mean (n,), the correlated
        deviations ``y_sd u'B eps`` (n, S) and the independent residual variance (n,) of the
        variance-corrected objectives. Calls with the same ``eps`` share the weight draws, so
        their deviations are jointly distributed (:class:`geodbk.joint.JointSampler`)."""

        return JointSampler(self, eps).draws(X, chunk_size=chunk_size)

    def features(self, X: Any, *, chunk_size: int = 65536) -> np.ndarray:
        """Basis functions ``phi(X)``, (n, r) float64 (standardised-target units)."""
        model = self._check_fitted()
        x_np = self._check_input(X)
        (phi,) = predict_in_chunks(
            lambda xb: (model.features(xb),),
            x_np,
            chunk_size=chunk_size,
            device=self.device_,
            dtype=self._fitted_dtype,
            width=int(self._as_fitted().rank),
        )
        return phi

    def kernel(
        self, X: Any, X_ref: Any, *, chunk_size: int = 65536, in_y_units: bool = False
    ) -> np.ndarray:
        """Prior kernel ``k(x, x_ref) = phi(x)' phi(x_ref)``, (n, m) float64.

        By default in standardised-target units (``k(x, x) <= sk2`` for DBK-RBF); with
        ``in_y_units=True`` multiplied by ``y_sd^2``.
        """
        phi_ref = self.features(X_ref, chunk_size=chunk_size)
        phi = self.features(X, chunk_size=chunk_size)
        k = phi @ phi_ref.T
        return k * self.y_std_**2 if in_y_units else k

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path, *, metadata: dict[str, Any] | None = None) -> Path:
        """Save to the folder ``path`` (``weights.safetensors`` + ``model.json``).

        ``metadata`` is an extra JSON-serialisable dict stored verbatim (``metadata_`` after
        loading).
        """
        model = self._check_fitted()
        meta = dict(metadata) if metadata is not None else dict(getattr(self, "metadata_", {}))
        doc = {
            "config": self._as_fitted().get_params(deep=False),
            "input_dim": self.n_features_in_,
            "standardization": {"y_mean": self.y_mean_, "y_std": self.y_std_},
            "history": self.history_,
            "best_epoch": self.best_epoch_,
            "stopped_early": bool(getattr(self, "stopped_early_", False)),
            "metadata": meta,
        }
        if hasattr(self, "feature_names_in_"):
            doc["feature_names"] = [str(c) for c in self.feature_names_in_]
        try:
            folder = save_bundle(path, tensors=dict(model.state_dict()), meta=doc)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"cannot save the model: metadata must be JSON-serialisable ({exc})"
            ) from exc
        self.metadata_ = meta
        return folder

    @classmethod
    def load(cls, path: str | Path, *, device: str = "auto") -> DBKRegressor:
        """Load a model saved by :meth:`save` (safetensors + JSON; no pickle).

        The estimator is built from the saved ``config`` with today's ``__init__`` parameters:
        options added later take their old behaviour when a bundle lacks them, and keys a
        bundle has that are no longer parameters are ignored, so that runs saved by older
        versions still load.

        Raises
        ------
        ModelFileError
            For a missing, corrupt, foreign or incompatible bundle.
        """
        tensors, meta = load_bundle(path)
        try:
            config = dict(meta["config"])
            config["device"] = device
            config = {**_LATER_DEFAULTS, **config}  # bundles from before these options
            est = cls(**{k: config[k] for k in cls._get_param_names()})  # unknown keys ignored
            est._validate()
            est._record_fit_params()
            est.device_ = resolve_device(device)
            est.n_features_in_ = int(meta["input_dim"])
            if meta.get("feature_names") is not None:
                names = np.asarray(meta["feature_names"], dtype=object)
                if names.shape != (est.n_features_in_,):
                    raise ValueError(f"{names.size} feature names for {est.n_features_in_} inputs")
                est.feature_names_in_ = names
            est.y_mean_ = float(meta["standardization"]["y_mean"])
            est.y_std_ = float(meta["standardization"]["y_std"])
            est.history_ = list(meta.get("history", []))
            est.best_epoch_ = int(meta.get("best_epoch", 0))
            est.stopped_early_ = bool(meta.get("stopped_early", False))
            est.metadata_ = dict(meta.get("metadata") or {})
            est.model_ = est._build_model(est.n_features_in_, torch.device("cpu"))
            est.model_.load_state_dict(tensors, strict=True)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ModelFileError(
                f"{path} is not a usable geodbk model ({type(exc).__name__}: {exc}); "
                "it may be from an incompatible version — retrain or re-save it"
            ) from exc
        est.model_.to(device=est.device_, dtype=_DTYPES[est.dtype]).eval()
        est._fold()
        return est
