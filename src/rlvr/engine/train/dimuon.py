"""Dimuon, Tinker's second optimizer, as rlvr reads its published description.

Tinker describes Dimuon by its step's hyperparameters (``types.DimuonParams`` and its documentation page): a
learning rate "applied to a direction with Frobenius norm sqrt(rank), with rank correction applied uniformly to all
LoRA matrices", ``beta1`` for the running average of gradients, ``grad_clip_norm``, a "positive damping that smooths
the row and column preconditioner", an "exponent for learning-rate correction relative to rank 32", and "matrix-sign
iteration count and normalization epsilon" as internal constants. rlvr's step, per LoRA matrix ``W`` (m x n) with
gradient ``G``, after clipping every gradient together to ``grad_clip_norm`` (as AdamW's step does)::

    M  <- beta1 M + (1 - beta1) G                                   running average (no bias correction: the
                                                                    direction below does not depend on M's scale)
    r_i = mean_j M_ij^2,  c_j = mean_i M_ij^2                       row and column second moments
    P  =  diag(r + damping * mean(r))^(-1/4) M diag(c + damping * mean(c))^(-1/4)    damped row/column preconditioner
    O  =  msign(P) = U V^T  for P = U S V^T                          the direction: every singular value 1, so
                                                                    ||O||_F = sqrt(min(m, n)) = sqrt(rank)
    W  <- W - learning_rate * (rank / 32) ** rank_lr_correction_exponent * O

``msign`` is computed by Newton-Schulz iterations ``X <- 1.5 X - 0.5 X X^T X`` from ``P / (||P||_F + eps)``, which
converge to ``U V^T`` (singular values far below ``||P||_F`` take more iterations and a zero matrix stays zero, as
LoRA's ``A`` does on the first step while ``B`` is still zero). Where the description leaves a constant open, rlvr's
reading is the module constants below; ``docs/training.md`` lists them and why.

Not here: AdamW and choosing between the two (``optim.py``), the checkpoint files (``checkpoint.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from rlvr.errors import CheckpointError, ConfigurationError

RANK_REFERENCE = 32
"""The rank whose learning rate the rank correction leaves as it is (Tinker's "relative to rank 32")."""
DAMPING = 0.1
"""rlvr's default damping, relative to the mean row (column) second moment, so the step does not depend on the
gradient's scale: 0 equalises rows and columns fully, large values turn the preconditioner off (plain msign)."""
RANK_LR_CORRECTION_EXPONENT = 0.5
"""rlvr's default exponent: with LoRA's alpha / rank scaling, 0.5 keeps the Frobenius norm of the adapter's first
update to the base weight about the same at every rank for one learning rate (and on ``tiny``, the best learning rate
the same at ranks 4 to 64); 0: no correction."""
SIGN_ITERATIONS = 20
"""Newton-Schulz iterations for msign: a singular value of 1e-3 of the matrix's Frobenius norm ends within 1e-4 of 1,
one of 3e-3 at 1; float32 noise (1e-7 of the norm) stays below 1e-3."""
NORM_EPS = 1e-7
"""Added to the Frobenius norm before the iterations, so an all-zero matrix gives an all-zero direction."""


@dataclass(frozen=True)
class DimuonStep:
    """One step's settings: ``DimuonParams``' fields, and the two a newer SDK may send (``damping``,
    ``rank_lr_correction_exponent``), else rlvr's defaults above."""

    learning_rate: float
    beta1: float = 0.9
    grad_clip_norm: float = 0.0
    damping: float = DAMPING
    rank_lr_correction_exponent: float = RANK_LR_CORRECTION_EXPONENT

    @classmethod
    def of(cls, params: Any) -> DimuonStep:
        """The settings of ``params`` (a ``types.DimuonParams``, or the same fields parsed from the wire), checked."""
        fields = dict(params.model_dump(exclude={"type"}) if hasattr(params, "model_dump") else params)
        unknown = sorted(set(fields) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigurationError(f"DimuonParams has no field {unknown[0]!r}; it takes learning_rate, beta1, "
                                     "grad_clip_norm (and damping, rank_lr_correction_exponent)")
        if "learning_rate" not in fields:
            raise ConfigurationError("DimuonParams.learning_rate is required; pass DimuonParams(learning_rate=...)")
        step = cls(**{k: float(v) for k, v in fields.items()})
        for name in cls.__dataclass_fields__:
            value = getattr(step, name)
            if not math.isfinite(value):
                raise ConfigurationError(f"DimuonParams.{name} must be finite, got {value}")
        if step.learning_rate < 0:
            raise ConfigurationError(f"DimuonParams.learning_rate must be >= 0, got {step.learning_rate}")
        if not 0 <= step.beta1 < 1:
            raise ConfigurationError(f"DimuonParams.beta1 must be in [0, 1), got {step.beta1}")
        if step.damping <= 0:
            raise ConfigurationError(f"DimuonParams.damping must be > 0 (it smooths the preconditioner), got "
                                     f"{step.damping}")
        return step


def precondition(momentum: torch.Tensor, damping: float) -> torch.Tensor:
    """``diag(r + d mean(r))^(-1/4) M diag(c + d mean(c))^(-1/4)``, ``r``/``c`` the row/column mean squares of M.

    ``momentum`` is (..., m, n): a stack of matrices of one shape is done at once. An all-zero matrix stays zero.
    """
    square = momentum.square()
    rows, cols = square.mean(dim=-1), square.mean(dim=-2)  # (..., m), (..., n)
    tiny = torch.finfo(momentum.dtype).tiny  # keeps an all-zero matrix's scaling finite, so it stays zero
    left = (rows + damping * rows.mean(dim=-1, keepdim=True)).clamp_min(tiny).rsqrt().sqrt()
    right = (cols + damping * cols.mean(dim=-1, keepdim=True)).clamp_min(tiny).rsqrt().sqrt()
    return left.unsqueeze(-1) * momentum * right.unsqueeze(-2)


def matrix_sign(matrix: torch.Tensor, iterations: int = SIGN_ITERATIONS, eps: float = NORM_EPS) -> torch.Tensor:
    """``U V^T`` for each ``matrix = U S V^T`` in (..., m, n), by Newton-Schulz iterations on the smaller side."""
    tall = matrix.shape[-2] > matrix.shape[-1]
    x = matrix.transpose(-2, -1) if tall else matrix  # (..., k, l) with k <= l
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + eps)
    for _ in range(iterations):
        x = 1.5 * x - 0.5 * (x @ x.transpose(-2, -1)) @ x
    return x.transpose(-2, -1) if tall else x


def direction(momentum: torch.Tensor, damping: float) -> torch.Tensor:
    """The step's direction for each matrix in (..., m, n): ``msign`` of its damped, preconditioned average."""
    return matrix_sign(precondition(momentum, damping))


class Dimuon:
    """Dimuon over a LoRA adapter's matrices (``rank``: the adapter's); state is one running average per matrix."""

    kind = "dimuon"

    def __init__(self, params: list[torch.nn.Parameter], rank: int) -> None:
        self.params = params
        self.rank = rank
        self.momentum: list[torch.Tensor | None] = [None] * len(params)
        self.steps = 0

    def step(self, params: Any) -> dict[str, float]:
        """Clip, average, take one step along each matrix's direction, zero the gradients; metrics as AdamW's."""
        settings = DimuonStep.of(params)
        if all(p.grad is None for p in self.params):
            raise ConfigurationError("optim_step was called with no gradients accumulated; call forward_backward "
                                     "first")
        for p in self.params:  # a matrix that received no gradient this step still averages in a zero
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        max_norm = settings.grad_clip_norm if settings.grad_clip_norm > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        scale = settings.learning_rate * (self.rank / RANK_REFERENCE) ** settings.rank_lr_correction_exponent
        with torch.no_grad():
            grads = [p.grad.detach().to(torch.float32).reshape(p.shape[0], -1) for p in self.params]
            momentum = [torch.zeros_like(g) if m is None else m for m, g in zip(self.momentum, grads, strict=True)]
            torch._foreach_mul_(momentum, settings.beta1)
            torch._foreach_add_(momentum, grads, alpha=1 - settings.beta1)
            self.momentum = list(momentum)
            by_shape: dict[tuple[int, ...], list[int]] = {}
            for i, m in enumerate(momentum):  # matrices of one shape go through the iterations together
                by_shape.setdefault(tuple(m.shape), []).append(i)
            for indices in by_shape.values():
                updates = direction(torch.stack([momentum[i] for i in indices]), settings.damping)  # (b, m, n)
                for i, update in zip(indices, updates, strict=True):
                    param = self.params[i]
                    param.add_(update.reshape(param.shape).to(param.dtype), alpha=-scale)
                    param.grad = None
        self.steps += 1
        return {"grad_norm:mean": grad_norm, "learning_rate:mean": settings.learning_rate}

    def state_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "version": 1, "steps": self.steps,
                "momentum": [None if m is None else m.detach().cpu().clone() for m in self.momentum]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("type") != self.kind or len(state.get("momentum", ())) != len(self.params):
            raise CheckpointError(f"optimizer state of type {state.get('type')!r} with "
                                  f"{len(state.get('momentum', ()))} matrices cannot resume Dimuon over "
                                  f"{len(self.params)} matrices")
        device = self.params[0].device if self.params else torch.device("cpu")
        self.momentum = [None if m is None else m.to(device, torch.float32) for m in state["momentum"]]
        self.steps = int(state["steps"])

