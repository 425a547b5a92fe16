"""What AMP code means by the names it uses, shared by the engine's models and the rules:
GradScaler and gradient-clipping calls, optimizers, a scaled backward pass. No torch."""

from __future__ import annotations

import ast

GRAD_SCALER = frozenset({
    "torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.cuda.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler", "torch.cpu.amp.GradScaler",
    "torch.cpu.amp.grad_scaler.GradScaler",
})
CLIP_GRAD = frozenset({
    "torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_", "torch.nn.utils.clip_grad.clip_grad_norm",
})
SCALER_PARAMETERS = frozenset({"scaler", "grad_scaler", "amp_scaler"})


def named_like_optimizer(code: str) -> bool:
    """``optimizer``, ``self.opt``, ``opt_g``, ``self._optimizer``: named like one, not a scheduler."""
    last = code.split(".")[-1].lower().lstrip("_")
    return ("optim" in last or last == "opt" or last.startswith("opt_") or last.endswith("_opt")) \
        and "sched" not in last


def steps_optimizer(call: ast.Call) -> bool:
    """An optimizer's step on its gradients: ``optimizer.step()``, ``self.opt_g.step()``, or a
    step handed one (``scaler.step(optimizer)``); not a scheduler's."""
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr != "step":
        return False
    return named_like_optimizer(ast.unparse(func.value)) or any(
        named_like_optimizer(ast.unparse(a)) for a in (*call.args, *(k.value for k in call.keywords)))


def scaled_backward_scaler(ctx, call: ast.Call) -> str | None:
    """For ``S.scale(loss).backward()`` the code of S."""
    func = call.func
    inner = func.value if isinstance(func, ast.Attribute) and func.attr == "backward" else None
    if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "scale":
        return ctx.code(inner.func.value)
    return None
