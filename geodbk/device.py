"""Device resolution: CUDA when asked for and available, the CPU otherwise."""

from __future__ import annotations

import warnings

import torch

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Turn a device request into a usable ``torch.device``.

    Parameters
    ----------
    device
        ``"auto"`` (CUDA if available, else CPU), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``, or a
        ``torch.device``.

    Returns
    -------
    torch.device
        The device to use. A CUDA request on a machine without CUDA falls back to the CPU with a
        ``RuntimeWarning`` that says so.

    Raises
    ------
    ValueError
        For any other string.
    """
    if isinstance(device, torch.device):
        device = str(device)
    name = str(device).strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        if torch.cuda.is_available():
            return torch.device(name)
        warnings.warn(
            f"device={device!r} was requested but CUDA is not available "
            f"(torch {torch.__version__}); falling back to the CPU.",
            RuntimeWarning,
            stacklevel=2,
        )
        return torch.device("cpu")
    raise ValueError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}")
