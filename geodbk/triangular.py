"""Products with lower-triangular matrices that skip the zero upper triangle.

Column blocks ``J = [s, s + w)`` of a lower-triangular ``L`` (r, r) are zero above row ``s``;
summing over the blocks costs ``(1 + w / r) / 2`` of the dense multiply-adds.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "MIN_BLOCK_WIDTH",
    "block_width_for",
    "latent_moments",
    "lower_gram",
    "lower_sq_norms",
]

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

    The zero rows above each block are skipped: ``(1 + w / r) / 2`` of the dense multiply-adds.
    ``width <= 0``: one dense product (``lower`` may then be any (r, k) factor). In place when
    no gradient flows; under autograd, the blocked backward of :func:`latent_moments`.
    """
    if torch.is_grad_enabled() and (u.requires_grad or lower.requires_grad):
        return latent_moments(u, u.new_zeros(u.shape[-1]), lower, width=width)[1]
    if width <= 0:
        return (u @ lower).square_().sum(-1)
    r = int(lower.shape[0])
    total = (u @ lower[:, :width]).square_().sum(-1)
    for start in range(width, r, width):
        total.add_((u[:, start:] @ lower[start:, start : start + width]).square_().sum(-1))
    return total


def latent_moments(
    u: torch.Tensor, mean: torch.Tensor, lower: torch.Tensor, *, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(u m, ||lower' u_i||^2, ||u_i||^2)`` for the rows ``u_i`` of ``u`` (n, r), with one
    backward for the three.

    The predictive mean, latent variance and feature norm a DBK training step needs from
    ``phi`` (``u``), ``q(w)``'s mean ``m`` (r,) and factor ``L`` (``lower``, r x r, lower
    triangular when ``width > 0``). Blocks as in :func:`lower_sq_norms`. The backward, with
    ``P_J = u[:, s:] L[s:, J]`` and ``G_J = 2 diag(g_var) P_J``::

        grad u = sum_J G_J L[s:, J]' (into u[:, s:]) + 2 diag(g_sq) u + g_mean m'
        grad L[s:, J] = u[:, s:]' G_J,  grad m = u' g_mean

    written into one buffer each: two passes over ``u``'s shape besides the products, where
    autograd's chain of the three makes about ten.
    """
    if not torch.is_grad_enabled():
        return u @ mean, lower_sq_norms(u, lower, width=width), (u * u).sum(-1)
    out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = _LatentMoments.apply(
        u, mean, lower, width
    )
    return out


class _LatentMoments(torch.autograd.Function):
    """:func:`latent_moments` under autograd."""

    @staticmethod
    def forward(
        ctx: Any, u: torch.Tensor, mean: torch.Tensor, lower: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r = int(lower.shape[0])
        blocked = 0 < width < r
        w = width if blocked else int(lower.shape[1])
        starts = list(range(0, r, w)) if blocked else [0]
        parts = [u[:, s:] @ lower[s:, s : s + w] for s in starts]
        var_f = (parts[0] * parts[0]).sum(-1)
        for part in parts[1:]:
            var_f.add_((part * part).sum(-1))
        ctx.width = w
        ctx.starts = starts
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(u, mean, lower, *parts)
        return u @ mean, var_f, (u * u).sum(-1)

    @staticmethod
    def backward(
        ctx: Any,
        grad_mean: torch.Tensor | None,
        grad_var: torch.Tensor | None,
        grad_sq: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, ...]:
        u, mean, lower, *parts = ctx.saved_tensors
        w = ctx.width
        need_u, need_mean, need_lower = ctx.needs_input_grad[:3]
        grad_u = grad_lower = None
        if grad_var is not None:
            twice = 2.0 * grad_var[:, None]
            # blocks: one buffer for L's gradient; one dense product: the product itself
            buffer = torch.empty_like(lower) if need_lower and len(parts) > 1 else None
            for s, part in zip(ctx.starts, parts, strict=True):
                g_part = part * twice
                if need_u:
                    if grad_u is None:  # the first block spans all of u's columns
                        grad_u = g_part @ lower[:, :w].T
                    else:
                        grad_u[:, s:].addmm_(g_part, lower[s:, s : s + w].T)
                if buffer is not None:  # written in place: BLAS takes the block's stride
                    buffer[:s, s : s + w] = 0.0
                    torch.mm(u[:, s:].T, g_part, out=buffer[s:, s : s + w])
                elif need_lower:
                    grad_lower = u.T @ g_part
            if buffer is not None:
                grad_lower = buffer
        if need_u:
            if grad_u is None:
                grad_u = torch.zeros_like(u)
            if grad_sq is not None:
                grad_u.addcmul_(u, grad_sq[:, None], value=2.0)
            if grad_mean is not None:
                grad_u.addr_(grad_mean, mean)
        grad_m = u.T @ grad_mean if need_mean and grad_mean is not None else None
        return grad_u, grad_m, grad_lower, None


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
        torch.mm(a[:, start:].T, b[:, start:stop], out=out[start:, start:stop])
        diagonal = out[start:stop, start:stop]
        diagonal.copy_(torch.tril(diagonal))
    return out
