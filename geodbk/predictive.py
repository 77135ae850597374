"""Predictive distributions: the :class:`Prediction` container and chunked evaluation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import norm

__all__ = ["Z95", "Prediction", "predict_in_chunks"]

#: Two-sided 95% standard-normal quantile, Φ^{-1}(0.975).
Z95 = float(norm.ppf(0.975))


@dataclass(frozen=True)
class Prediction:
    """Gaussian predictive distribution at n points (numpy float64, units of y).

    Attributes
    ----------
    mean
        Predictive mean ``mu(x)``.
    var
        Predictive variance of y, ``var_f(x) + s2`` (noise included).
    var_f
        Latent variance of f, ``var_f(x)``.
    """

    mean: np.ndarray
    var: np.ndarray
    var_f: np.ndarray

    @property
    def std(self) -> np.ndarray:
        """Predictive standard deviation ``sqrt(var)``."""
        return np.sqrt(self.var)

    @property
    def std_f(self) -> np.ndarray:
        """Latent standard deviation ``sqrt(var_f)``."""
        return np.sqrt(self.var_f)

    @property
    def noise_var(self) -> np.ndarray:
        """Noise variance ``var - var_f``."""
        return self.var - self.var_f

    @property
    def lower(self) -> np.ndarray:
        """Lower end of the 95% prediction interval, ``mean - z_{0.975} std``."""
        return self.mean - Z95 * self.std

    @property
    def upper(self) -> np.ndarray:
        """Upper end of the 95% prediction interval, ``mean + z_{0.975} std``."""
        return self.mean + Z95 * self.std

    def interval(self, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
        """Central prediction interval ``mean ± Φ^{-1}((1+level)/2) std``."""
        z = float(norm.ppf(0.5 + 0.5 * level))
        return self.mean - z * self.std, self.mean + z * self.std

    def __len__(self) -> int:
        return int(self.mean.shape[0])


def predict_in_chunks(
    fn: Callable[[torch.Tensor], tuple[torch.Tensor, ...]],
    x: np.ndarray,
    *,
    chunk_size: int,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[np.ndarray, ...]:
    """Apply ``fn`` to ``x`` in chunks of at most ``chunk_size`` rows, under ``no_grad``.

    Only one chunk is on the device at a time; outputs are gathered as numpy float64 arrays
    (preallocated, so memory is O(n) for the outputs plus O(chunk_size r) for the work).

    Parameters
    ----------
    fn
        Maps a (b, d) tensor to a tuple of (b,) or (b, k) tensors.
    x
        Inputs, (n, d).
    chunk_size
        Maximum rows per chunk.
    device, dtype
        Where and in which precision ``fn`` runs.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    n = x.shape[0]
    outputs: list[np.ndarray] | None = None
    with torch.no_grad():
        for start in range(0, max(n, 1), chunk_size):
            chunk = torch.as_tensor(x[start : start + chunk_size], dtype=dtype, device=device)
            results = fn(chunk)
            if outputs is None:
                outputs = [np.empty((n, *r.shape[1:]), dtype=np.float64) for r in results]
            for out, res in zip(outputs, results, strict=True):
                out[start : start + chunk.shape[0]] = res.detach().to("cpu", torch.float64).numpy()
    assert outputs is not None
    return tuple(outputs)
