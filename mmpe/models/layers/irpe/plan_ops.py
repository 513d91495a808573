"""The expansion plans of iRPE as autograd functions.

``expand`` (per-bucket values to the (L0, L0) term) and ``reduce`` (its
adjoint, the bucket sums) of a plan of :mod:`~mmpe.models.layers.irpe.plans`
are each the other's backward; both compute in their input's dtype, with
autocast off.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .plans import Plan


def _no_autocast(t: Tensor):
    """Context disabling autocast so a plan computes in its input dtype."""
    return torch.autocast(t.device.type, enabled=False)


class Expand(torch.autograd.Function):
    """Differentiable ``plan.expand``; its backward is ``plan.reduce``."""

    @staticmethod
    def forward(ctx, p: Tensor, plan: Plan) -> Tensor:
        ctx.plan = plan
        with _no_autocast(p):
            return plan.expand(p)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], None]:
        with _no_autocast(grad):
            return ctx.plan.reduce(grad), None


class ExpandAdd(torch.autograd.Function):
    """``out += plan.expand(p)`` in place (product plans only)."""

    @staticmethod
    def forward(ctx, out: Tensor, p: Tensor, plan: Plan) -> Tensor:
        ctx.plan = plan
        ctx.mark_dirty(out)
        with _no_autocast(p):
            # out: (..., L0, L0) with the leading dims flattened in p
            plan.expand_add_(p, out.view(p.shape[0], *out.shape[-2:]))
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Tensor, Optional[Tensor], None]:
        with _no_autocast(grad):
            flat = grad.reshape(-1, *grad.shape[-2:])
            return grad, ctx.plan.reduce(flat), None


class Reduce(torch.autograd.Function):
    """Differentiable ``plan.reduce``; its backward is ``plan.expand``."""

    @staticmethod
    def forward(ctx, a: Tensor, plan: Plan) -> Tensor:
        ctx.plan = plan
        with _no_autocast(a):
            return plan.reduce(a)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tuple[Optional[Tensor], None]:
        with _no_autocast(grad):
            return ctx.plan.expand(grad), None
