"""Device resolution: auto, cpu, cuda with a CPU fallback and a warning, anything else refused."""

from __future__ import annotations

import warnings

import pytest
import torch

from geodbk.device import resolve_device


def test_cuda_request_without_cuda_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(RuntimeWarning, match="CUDA is not available"):
        assert resolve_device("cuda") == torch.device("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError):
        resolve_device("tpu")
