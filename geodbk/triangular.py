"""Products with lower-triangular matrices that skip the zero upper triangle.

Column blocks ``J = [s, s + w)`` of a lower-triangular ``L`` (r, r) are zero above row ``s``;
summing over the blocks costs ``(1 + w / r) / 2`` of the dense multiply-adds.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MIN_BLOCK_WIDTH", "block_width_for", "lower_gram", "lower_sq_norms"]

#: Column blocks of a lower-triangular factor are ``max(this, r // 8)`` wide.
MIN_BLOCK_WIDTH = 64


def block_width_for(rank: int) -> int:
    """Column-block width of a lower-triangular variance factor of rank ``rank``: ``max(64,
    r // 8)``, or 0 (one dense product) when that is the whole factor."""
    width = max(MIN_BLOCK_WIDTH, rank // 8)
    return width if width < rank else 0


def lower_sq_norms(u: torch.Tensor, lower: torch.Tensor, *, width: int) -> torch.Tensor:
    """``||lower' u_i||^2`` for each row ``u_i`` of ``u`` (n, r), ``lower`` (r, r) lower
    triangular: ``sum_J ||lower[s:, J]' u[:, s:]||^2`` over column blocks ``J = [s, s + w)``.

    The zero rows above each block are skipped, in the product and, under autograd, in both
    gradient products: ``(1 + w / r) / 2`` of the dense multiply-adds. ``width <= 0``: one
    dense product (``lower`` may then be any (r, k) factor). In place when no gradient flows.
    """
    grad = torch.is_grad_enabled() and (u.requires_grad or lower.requires_grad)
    if width <= 0:
        if grad:
            return torch.linalg.vector_norm(u @ lower, dim=-1).square()
        return (u @ lower).square_().sum(-1)
    if grad:
        out: torch.Tensor = _LowerSqNorms.apply(u, lower, width)
        return out
    r = int(lower.shape[0])
    total = (u @ lower[:, :width]).square_().sum(-1)
    for start in range(width, r, width):
        total.add_((u[:, start:] @ lower[start:, start : start + width]).square_().sum(-1))
    return total


class _LowerSqNorms(torch.autograd.Function):
    """:func:`lower_sq_norms` with its gradients written block by block.

    With ``P_J = u[:, s:] lower[s:, J]`` and ``G_J = 2 diag(g) P_J`` (``g`` the incoming
    gradient): ``grad u[:, s:] += G_J lower[s:, J]'`` and ``grad lower[s:, J] = u[:, s:]' G_J``
    (zero elsewhere), into one buffer each rather than one zero-filled tensor per block.
    """

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor, lower: torch.Tensor, width: int) -> torch.Tensor:
        starts = range(0, int(lower.shape[0]), width)
        parts = [u[:, s:] @ lower[s:, s : s + width] for s in starts]
        total = parts[0].square().sum(-1)
        for part in parts[1:]:
            total.add_(part.square().sum(-1))
        ctx.width = width
        ctx.save_for_backward(u, lower, *parts)
        return total

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        u, lower, *parts = ctx.saved_tensors
        w = ctx.width
        grad_u = None  # the first block spans all of u's columns: it sets grad_u
        grad_lower = torch.empty_like(lower) if ctx.needs_input_grad[1] else None
        twice = 2.0 * grad[:, None]
        for s, part in zip(range(0, int(lower.shape[0]), w), parts, strict=True):
            g_part = part * twice
            if ctx.needs_input_grad[0]:
                if grad_u is None:
                    grad_u = g_part @ lower[:, :w].T
                else:
                    grad_u[:, s:].addmm_(g_part, lower[s:, s : s + w].T)
            if grad_lower is not None:
                grad_lower[:s, s : s + w] = 0.0
                grad_lower[s:, s : s + w] = u[:, s:].T @ g_part
        return grad_u, grad_lower, None


def lower_gram(a: torch.Tensor, b: torch.Tensor, *, width: int) -> torch.Tensor:
    """``tril(a' b)`` for ``a``, ``b`` of shape (n, r), by column blocks: block ``J = [s, s + w)``
    takes ``a[:, s:]' b[:, J]``, so the strict upper triangle is not computed (``width <= 0``:
    one dense product)."""
    if width <= 0:
        return torch.tril(a.T @ b)
    r = int(b.shape[1])
    out = torch.zeros(r, r, dtype=b.dtype, device=b.device)
    for start in range(0, r, width):
        stop = min(start + width, r)
        out[start:, start:stop] = a[:, start:].T @ b[:, start:stop]
        diagonal = out[start:stop, start:stop]
        diagonal.copy_(torch.tril(diagonal))
    return out
