"""The residual MLP backbone: shape and structure."""

from __future__ import annotations

import torch

from geodbk.backbone import ResidualMLP


def test_backbone_shape_and_structure() -> None:
    net = ResidualMLP(3, 16)
    with torch.no_grad():
        out = net(torch.randn(5, 3))
    assert out.shape == (5, 16)
    assert len(net.blocks) == 2
    # final SiLU: outputs bounded below by min SiLU = -0.2785
    assert float(out.min()) >= -0.279
