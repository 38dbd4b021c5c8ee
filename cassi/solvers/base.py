"""What every solver shares: argument checks, the iteration loop, history and stopping.

A solver is called as ``solver(op, y, x0=None, gt=None, callback=None) -> Result`` with
``op`` a :class:`cassi.CASSI`, y (B, 1, H, W+Δ) and x0, gt (B, C, H, W). Subclasses give
``_init(op, y, x) -> state`` and ``_step(op, y, state, k) -> (x_k, A x_k)``; the loop here
records, per iteration, the relative residual ‖y − A x_k‖/‖y‖ and (with ``gt``) the PSNR
10·log10(1/MSE) per sample, and stops after ``iters`` steps, when every sample's residual
is below ``tol``, or when ``callback(k, x_k, info)`` returns True (info: the "residual" and
"psnr" (B,) of x_k; x_k is the solver's buffer: clone it to keep it).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from cassi import threads
from cassi._checks import check_number
from cassi.registry import register, resolve

__all__ = ["DEFAULT_SOLVER", "Result", "Solver", "PseudoInverse", "build_solver", "check_int", "check_number", "psnr"]


def check_int(name: str, value, minimum: int = 1) -> int:
    """``value`` as an int >= minimum, else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def psnr(x: torch.Tensor, gt: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """10·log10(1/MSE) per sample on [0, 1] data: (B, C, H, W) × 2 -> (B,); ``out`` an x-sized scratch."""
    return -10 * torch.log10(torch.sub(x, gt, out=out).square_().flatten(1).mean(1))


def _check_cube(name: str, t, op, batch: int) -> None:
    want = (batch, *op.x_shape)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if tuple(t.shape) != want:
        raise ValueError(f"{name} must have shape (B, C, H, W) = {want} to match y and the operator, "
                         f"got {tuple(t.shape)}")


def check_inputs(op, y, x0=None, gt=None) -> None:
    """ValueError naming the argument, the expected and the given shape."""
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
    if y.ndim != 4 or tuple(y.shape[1:]) != op.y_shape:
        raise ValueError(f"y must have shape (B, 1, H, W+Δ) = (B, {', '.join(map(str, op.y_shape))}) for this "
                         f"operator, got {tuple(y.shape)}")
    if op.mask.shape[0] not in (1, y.shape[0]):
        raise ValueError(f"y has batch {y.shape[0]} but the operator has a batch of {op.mask.shape[0]} masks")
    for name, t in (("x0", x0), ("gt", gt)):
        if t is not None:
            _check_cube(name, t, op, y.shape[0])


@dataclass
class Result:
    """x (B, C, H, W); history: "residual" (K+1, B) and, with gt, "psnr" (K+1, B), row 0 = the
    initial guess, plus "sigma" (K,) for scheduled denoisers; iterations K. Unpacks as (x, history)."""

    x: torch.Tensor
    history: dict = field(default_factory=dict)
    iterations: int = 0

    def __iter__(self):
        return iter((self.x, self.history))


class Solver:
    """Base of the iterative solvers: ``iters`` steps at most, stop when max residual < ``tol``."""

    def __init__(self, iters: int = 100, tol: float = 0.0):
        self.iters = check_int("iters", iters)
        self.tol = check_number("tol", tol, positive=False)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"

    # subclasses ---------------------------------------------------------------------------
    def _init(self, op, y: torch.Tensor, x: torch.Tensor):
        """Per-call state (buffers) from the initial guess x; x may be kept and overwritten."""
        raise NotImplementedError

    def _step(self, op, y: torch.Tensor, state, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Iteration k: the new estimate x_k (B, C, H, W) and A x_k (B, 1, H, W+Δ)."""
        raise NotImplementedError

    # the loop -----------------------------------------------------------------------------
    def __call__(self, op, y: torch.Tensor, x0: torch.Tensor | None = None, gt: torch.Tensor | None = None,
                 callback: Callable | None = None) -> Result:
        """Reconstruct x (B, C, H, W) from y (B, 1, H, W+Δ); x0 defaults to op.pinv(y)."""
        check_inputs(op, y, x0, gt)
        with torch.no_grad():
            x = op.pinv(y) if x0 is None else x0.detach().clone()
            state = self._init(op, y, x)
            ynorm = torch.linalg.vector_norm(y.flatten(1), dim=1).clamp_min(torch.finfo(y.dtype).tiny)
            tmp = torch.empty_like(x) if gt is not None else None

            def record(x, ax):
                hist["residual"].append(torch.linalg.vector_norm((y - ax).flatten(1), dim=1) / ynorm)
                if gt is not None:
                    hist["psnr"].append(psnr(x, gt, out=tmp))

            hist = {"residual": []} | ({"psnr": []} if gt is not None else {})
            record(x, op(x))
            k = 0
            while k < self.iters:
                threads.adapt()  # fewer threads while other processes keep cores busy
                x, ax = self._step(op, y, state, k)
                k += 1
                record(x, ax)
                if callback is not None and callback(k, x, {n: v[-1] for n, v in hist.items()}) is True:
                    break
                if self.tol > 0 and float(hist["residual"][-1].max()) < self.tol:
                    break
            history = {n: torch.stack(v).cpu() for n, v in hist.items()}
            history.update(self._history(state, k))
            return Result(x, history, k)

    def _history(self, state, k: int) -> dict:
        """Extra history entries (e.g. the denoiser schedule) after k iterations."""
        return {}


@register
class PseudoInverse(Solver):
    """x = A⁺ y = Aᵀ(y ⊘ Φ) (0 where Φ = 0): no iterations, the usual initialisation."""

    def __init__(self):
        self.iters, self.tol = 0, 0.0

    def _init(self, op, y, x):
        return None


def schedule(iters: int | None, sigma: float | None, decay: float = 1.0, sigma_min: float = 0.0,
             stages: Sequence | None = None, name: str = "sigma", min_name: str = "sigma_min",
             ) -> tuple[int, list[float] | None]:
    """(iters, per-iteration strengths) of a denoiser schedule.

    ``stages`` [(n_1, σ_1), (n_2, σ_2), ...] runs n_i iterations at σ_i (iters = Σ n_i, or must
    equal it; sigma, decay and sigma_min are then unused); else σ_k = max(σ·decay^k, sigma_min),
    or None (call the denoiser without σ) when sigma is None. iters None means 100 (or Σ n_i).
    Error messages call σ ``name`` and sigma_min ``min_name``.
    """
    if stages is not None:
        if isinstance(stages, (str, bytes)) or not hasattr(stages, "__len__") or len(stages) == 0:
            raise ValueError(f"stages must be a non-empty list of (iters, {name}) pairs, got {stages!r}")
        sig = []
        for i, st in enumerate(stages):
            if isinstance(st, (str, bytes)) or not hasattr(st, "__len__") or len(st) != 2:
                raise ValueError(f"stages[{i}] must be a pair (iters, {name}), got {st!r}")
            sig += [check_number(f"stages[{i}] {name}", st[1])] * check_int(f"stages[{i}] iters", st[0])
        if iters is not None and check_int("iters", iters) != len(sig):
            raise ValueError(f"iters={iters} does not match the stages' total of {len(sig)} iterations; "
                             f"give iters=None or {len(sig)}")
        return len(sig), sig
    iters = 100 if iters is None else check_int("iters", iters)
    if not (check_number("decay", decay) <= 1):
        raise ValueError(f"decay must be a number in (0, 1], got {decay!r}")
    check_number(min_name, sigma_min, positive=False)
    if sigma is None:
        return iters, None
    s0 = check_number(name, sigma)
    return iters, [max(s0 * decay**k, sigma_min) for k in range(iters)]


#: the shipped GAP-TV (conf/solver/gap_tv.yaml): a Refiner's first-iterate solver when none is given
DEFAULT_SOLVER = {"_target_": "cassi.solvers.GAPTV", "iters": 80, "tv_weight": 0.4, "tv_iters": 5, "decay": 0.95}


def build_solver(spec) -> Solver:
    """A :class:`Solver` from {"_target_": a registered solver (:mod:`cassi.registry`), **arguments} (or a Solver,
    returned as is)."""
    if isinstance(spec, Solver):
        return spec
    if not isinstance(spec, dict) or not isinstance(spec.get("_target_"), str):
        raise ValueError(f"solver must be a dict {{'_target_': 'cassi.solvers.GAPTV', ...}}, got {spec!r}")
    args = dict(spec)
    return resolve(args.pop("_target_"), Solver, "solver class")(**args)
