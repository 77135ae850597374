"""Baseline tests use tiny problems, which run fastest on one torch thread (and do not fight
the other test processes for the 2 cores); the previous thread count is restored afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
