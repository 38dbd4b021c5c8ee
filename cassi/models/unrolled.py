"""Deep unrolled reconstruction: K stages of a data-consistency step through the operator and a
learned prior network, starting from the masked pseudo-inverse x₀ = A⁺y = Aᵀ(y ⊘ Φ).

A model is called like a solver, ``model(op, y) -> x`` (B, C, H, W), with ``op`` a
:class:`cassi.CASSI` of any geometry (step/offsets, axis, batch of masks) and band count
``bands``; the geometry always comes from the operator. ``model(op, y, return_stages=True)``
gives the list [x₀, z₁, ..., z_K] of every stage's output (for per-stage supervision).

Families (the data step is ``op.data_step``: z + Aᵀ((y − A z) ⊘ (Φ + ρ))):

- :class:`GAPNet`:  x_k = z + λ_k·Aᵀ((y − A z) ⊘ Φ),  z_k = U-Net_k(x_k)
- :class:`ADMMNet`: x_k = data_step(z + b, y, ρ_k),  z_k = U-Net_k(x_k − b),  b ← b − (x_k − z_k)

DAUHST (the toolbox's, weight-compatible) is :class:`cassi.models.zoo.dauhst.DAUHST`.
"""
from __future__ import annotations

import math
import weakref
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from cassi._checks import check_positive_int, plain as _plain
from cassi.models.blocks import ResStack, UNet
from cassi.models.camera import check_camera, check_geometry
from cassi.registry import register

PRIORS = {"unet": UNet, "resstack": ResStack}

__all__ = ["Reconstructor", "Unrolled", "GAPNet", "ADMMNet"]


def _config(model: nn.Module, args: dict) -> dict:
    """The constructor call that rebuilds ``model``: {"_target_": class path, **arguments as plain data}."""
    cls = type(model)
    return {"_target_": f"{cls.__module__}.{cls.__qualname__}",
            **{k: _plain(v) for k, v in args.items() if k not in ("self", "__class__")}}


def _inverse_softplus(v: float) -> float:
    return math.log(math.expm1(v))


class Reconstructor(nn.Module):
    """Base class of cassi's learned models: called like a solver, ``model(op, y) -> x`` (B, C, H, W), with
    ``bands`` (C), ``config`` (the constructor call, stored in checkpoints) and, once loaded from a checkpoint,
    ``geometry`` (the dispersion it was trained for) and ``source`` (the file). :meth:`check` refuses an
    operator of another band count or dispersion with one line naming both."""

    #: set when loaded from a checkpoint: {"offsets": [...], "axis": "w", "bands"} it was trained for
    #: (:meth:`cassi.geometry.Geometry.record`), and its path
    geometry: dict | None = None
    source: str | None = None
    camera: dict | None = None  # the masks and noise it was trained for (cassi.models.camera)
    bands: int

    def __repr__(self) -> str:
        """One line, like a solver's (used as the method's name in tables and reports); print a submodule
        (e.g. ``model.priors``) for its layers."""
        n = sum(p.numel() for p in self.parameters())
        where = f", from {self.source}" if self.source else ""
        stages = f", stages={self.stages}" if isinstance(getattr(self, "stages", None), int) else ""
        return f"{type(self).__name__}(bands={self.bands}{stages}, {n / 1e6:.3g} M parameters{where})"

    def __call__(self, *args, **kwargs):
        """``model(op, y, ...)``: :meth:`check` when the model first meets ``op`` (an operator object it was not
        last called with), then ``forward``; the one place every reconstructor's check runs."""
        op = args[0] if args else kwargs.get("op")
        met = self.__dict__.get("_met")
        if op is not None and (met is None or met() is not op):
            self.check(op)
            self.__dict__["_met"] = weakref.ref(op)
        return super().__call__(*args, **kwargs)

    def __getstate__(self):
        """Pickled (torch.save, deepcopy, spawned processes) without the operator last met, a weak reference: the
        copy checks the first operator it meets."""
        state = dict(super().__getstate__())
        state.pop("_met", None)
        return state

    def check(self, op) -> None:
        """Before reconstructing through ``op``: :meth:`check_geometry`, then (in eval mode: a training batch's
        masks are the camera being trained) one warning line when its mask is not one the model was trained for
        (:func:`cassi.models.camera.check_camera`)."""
        self.check_geometry(op)
        if not self.training:
            check_camera(self, op)

    def check_geometry(self, op) -> None:
        """ValueError when ``op``'s band count (or, for a loaded checkpoint, its dispersion) differs
        (:func:`cassi.models.camera.check_geometry`)."""
        check_geometry(self, op)


class Unrolled(Reconstructor):
    """Base class: the stage loop, geometry checks, optional activation checkpointing per stage.

    Args:
        bands: C, the band count the priors are built for (must equal ``op.bands``).
        stages: K, the number of unrolled stages.
        share: one prior for all stages (weights shared) instead of one per stage.
        checkpointing: recompute each stage's activations in backward (saves memory in training).
        normalize: run the stages on y/s and return s·x with s = mean(A⁺y)/0.5 per sample, so that
            model(op, a·y) = a·model(op, y): the priors see every scene at one brightness (exact, since
            the data steps are linear in (z, y)).

    Subclasses build ``self.priors`` (K modules, or 1 when shared) and implement
    ``_stage(k, op, y, state) -> state`` on a dict state whose "z" is the stage output.
    """

    def __init__(self, bands: int, stages: int, share: bool = False, checkpointing: bool = False,
                 normalize: bool = False):
        super().__init__()
        for name, v in (("bands", bands), ("stages", stages)):
            check_positive_int(name, v)
        self.bands, self.stages, self.share, self.checkpointing = bands, stages, share, checkpointing
        self.normalize = normalize

    def _make_priors(self, make) -> nn.ModuleList:
        return nn.ModuleList(make() for _ in range(1 if self.share else self.stages))

    def prior(self, k: int) -> nn.Module:
        return self.priors[0 if self.share else k]

    def _init(self, op, y: torch.Tensor, x0: torch.Tensor) -> dict:
        return {"z": x0}

    def _stage(self, k: int, op, y: torch.Tensor, state: dict) -> dict:
        raise NotImplementedError

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None, return_stages: bool = False):
        """x_K (B, C, H, W) from y (B, 1, H, W+Δ); with ``return_stages`` the list [x₀, z₁, …, z_K].
        ``gt`` is accepted (and ignored) so that the model is called like a solver."""
        x0 = op.pinv(y)
        scale = None
        if self.normalize:  # s (B, 1, 1, 1); an all-dark sample keeps s = 2e-6 (its outputs stay ~0)
            scale = (x0.detach().mean(dim=(1, 2, 3), keepdim=True) / 0.5).clamp_min(2e-6)
            x0, y = x0 / scale, y / scale
        state = self._init(op, y, x0)
        outs = [x0]
        for k in range(self.stages):
            if self.checkpointing and torch.is_grad_enabled():
                keys = sorted(state)

                def run(*vals, k=k, keys=keys):
                    out = self._stage(k, op, y, dict(zip(keys, vals)))
                    return tuple(out[key] for key in keys)

                state = dict(zip(keys, checkpoint(run, *(state[key] for key in keys), use_reentrant=False)))
            else:
                state = self._stage(k, op, y, state)
            outs.append(state["z"])
        if scale is not None:
            outs = [o * scale for o in outs]
        return outs if return_stages else outs[-1]

    def _prior(self, k: int, x: torch.Tensor) -> torch.Tensor:
        """The prior's output in the operator's dtype (under autocast the prior may compute in bf16)."""
        return self.prior(k)(x).to(x.dtype)


@register
class GAPNet(Unrolled):
    """GAP-Net (Meng et al. 2020): x_k = z + λ_k·Aᵀ((y − A z) ⊘ Φ), z_k = U-Net_k(x_k).

    λ_k is learned per stage (initialised to 1, the GAP projection; the paper fixes it to 1).
    ``prior``: "unet" (widths ``width``·2^s over ``depth`` scales) or "resstack" (``depth`` residual
    blocks of ``width`` channels at half resolution: :class:`ResStack`). (B, 1, H, W+Δ) -> (B, C, H, W).
    """

    def __init__(self, bands: int = 28, stages: int = 9, width: int = 32, depth: int = 3, share: bool = False,
                 checkpointing: bool = False, normalize: bool = False, prior: str = "unet"):
        super().__init__(bands, stages, share, checkpointing, normalize)
        if prior not in PRIORS:
            raise ValueError(f"prior must be one of {sorted(PRIORS)}, got {prior!r}")
        self.config = _config(self, dict(locals()))
        self.priors = self._make_priors(lambda: PRIORS[prior](bands, bands, width, depth))
        self.steps = nn.Parameter(torch.ones(stages))

    def _stage(self, k, op, y, state):
        z = state["z"]
        x = z + self.steps[k] * (op.data_step(z, y) - z)
        return {"z": self._prior(k, x)}


@register
class ADMMNet(Unrolled):
    """ADMM-Net (Ma et al. 2019, as in the MST toolbox): x_k = z + b + Aᵀ((y − A(z + b)) ⊘ (Φ + ρ_k)),
    z_k = U-Net_k(x_k − b), b ← b − (x_k − z_k), from z = A⁺y, b = 0.

    ρ_k = softplus(θ_k) ≥ 0 per stage, initialised to ``rho`` (the reference code learns ρ_k from 0
    without a sign constraint, which can divide by ≈ 0 where Φ is small). (B, 1, H, W+Δ) -> (B, C, H, W).
    """

    def __init__(self, bands: int = 28, stages: int = 9, width: int = 32, depth: int = 3, share: bool = False,
                 rho: float = 0.01, checkpointing: bool = False, normalize: bool = False):
        super().__init__(bands, stages, share, checkpointing, normalize)
        self.config = _config(self, dict(locals()))
        self.priors = self._make_priors(lambda: UNet(bands, bands, width, depth))
        self.theta = nn.Parameter(torch.full((stages,), _inverse_softplus(rho)))

    def _init(self, op, y, x0):
        return {"b": torch.zeros_like(x0), "z": x0}

    def _stage(self, k, op, y, state):
        z, b = state["z"], state["b"]
        x = op.data_step(z + b, y, F.softplus(self.theta[k]))
        z = self._prior(k, x - b)
        return {"b": b - (x - z), "z": z}
