"""The residual MLP backbone g: R^d -> R^h shared by every DBK expansion."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ResidualBlock", "ResidualMLP"]


class ResidualBlock(nn.Module):
    """One pre-norm residual block, ``z + Linear(SiLU(Linear(LayerNorm(z))))``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, hidden)
        self.fc2 = nn.Linear(hidden, hidden)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """Return ``z + fc2(SiLU(fc1(LayerNorm(z))))``."""
        return z + self.fc2(torch.nn.functional.silu(self.fc1(self.norm(z))))


class ResidualMLP(nn.Module):
    """Residual MLP backbone (methods §1).

    ``g(x) = SiLU(LayerNorm(B2(B1(W0 x + b0))))`` with ``W0: R^d -> R^h`` and two
    :class:`ResidualBlock` s ``B1, B2``.

    Parameters
    ----------
    d
        Input dimension.
    h
        Latent (hidden) dimension.
    n_blocks
        Number of residual blocks (2 in the method).
    """

    def __init__(self, d: int, h: int, *, n_blocks: int = 2) -> None:
        super().__init__()
        self.input_dim = int(d)
        self.hidden = int(h)
        self.inp = nn.Linear(d, h)
        self.blocks = nn.ModuleList([ResidualBlock(h) for _ in range(n_blocks)])
        self.out_norm = nn.LayerNorm(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``x`` of shape (b, d) to ``g(x)`` of shape (b, h)."""
        z = self.inp(x)
        for block in self.blocks:
            z = block(z)
        return torch.nn.functional.silu(self.out_norm(z))
