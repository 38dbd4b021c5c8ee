"""The MST toolbox's conventions, derived from a :class:`cassi.CASSI` and a measurement, and its weights.

The toolbox (caiyuanhao1998/MST, ``simulation/train_code``) calls every model as ``model(input_meas,
input_mask)`` with inputs that its ``template.py`` chooses per method. Here each model derives them inside
``model(op, y)`` from the operator (mask, dispersion, band count) and y (B, 1, H, W+Δ):

- H  = y·2/C shifted back per band: :func:`shift_back`  (B, C, H, W)
- HM = H ⊙ M: ``shift_back(op, y) * mask3d(op)``
- Y  = y itself (the models that work in the dispersed domain of width W+Δ)
- Phi = the mask placed at each band's offset: :func:`shifted_mask`  (1|B, C, H, W+Δ)
- Φ_s = Σ_c Phi², zeros set to 1: :func:`phi_s`  (1|B, 1, H, W+Δ) (= ``op.phi``, a precomputed buffer)
- Mask = the mask per band: :func:`mask3d`  (1|B, C, H, W)

For dispersion along h (``axis="h"``) every map works on the transposed frame, so that models written for
dispersion along w see their usual layout: :func:`dispersed_last` / :func:`undo`.

Converted weights: :func:`register_method` records, per toolbox method name (``mst_s``, ``dauhst_9stg``, ...),
the cassi class, its arguments, and how the toolbox's state dict maps to the class's; :func:`convert` writes a
cassi checkpoint (``cassi.models.load_model``, ``ckpt=`` in every script) from the toolbox's ``.pth``.
"""
from __future__ import annotations

import hashlib
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from cassi.models.unrolled import Reconstructor
from cassi.registry import resolve

__all__ = ["ToolboxModel", "shift_back", "shifted_mask", "phi_s", "mask3d", "integer_offsets", "roll_bands",
           "dispersed_last", "undo", "register_method", "METHODS", "convert", "toolbox_state"]


# ---------------------------------------------------------------------------------------------- inputs
def dispersed_last(op, t: torch.Tensor) -> torch.Tensor:
    """``t`` with the dispersed axis last (a transposed view for ``axis="h"``)."""
    return op._t(t)


undo = dispersed_last  # the transpose is its own inverse


def integer_offsets(op, what: str = "this model") -> list[int]:
    """The operator's per-band offsets as integers; ValueError in one line when any is fractional."""
    offs = [int(round(o)) for o in op.offsets]
    if any(abs(o - r) > 1e-6 for o, r in zip(op.offsets, offs)):
        raise ValueError(f"{what} works on the dispersed frame, which needs integer offsets; the operator has "
                         f"fractional ones ({op.offsets[:3]}...): use an integer step (e.g. camera.step=2)")
    return offs


def shift_back(op, y: torch.Tensor, scale: bool = True) -> torch.Tensor:
    """H = (y·2/C when ``scale``) shifted back per band: (B, 1, H, W+Δ) -> (B, C, H, W), H_c = y[..., d_c : d_c + W].
    Any geometry (fractional offsets: the operator's interpolation with a unit mask)."""
    op._check(y, "y", op.y_shape, None)
    ones = torch.ones((1, 1, *dispersed_last(op, op.mask).shape[-2:]), dtype=y.dtype, device=y.device)
    h = undo(op, op.backend.adjoint(dispersed_last(op, y), ones, op.geometry))
    return h * (2.0 / op.bands) if scale else h


def shifted_mask(op) -> torch.Tensor:
    """Phi: the mask placed at each band's offset, (1|B, C, H, W+Δ) (the toolbox's ``mask_3d_shift``); integer
    offsets only."""
    offs = integer_offsets(op, "Phi (the shifted mask)")
    m = dispersed_last(op, op.mask)
    w = m.shape[-1]
    out = m.new_zeros((m.shape[0], op.bands, m.shape[-2], w + op.delta))
    for c, d in enumerate(offs):
        out[:, c, :, d:d + w] = m[:, c if m.shape[1] > 1 else 0]
    return undo(op, out)


def phi_s(op) -> torch.Tensor:
    """Φ_s = Σ_c Phi², with 1 where it is 0 (the toolbox's ``Phi_s``): (1|B, 1, H, W+Δ)."""
    return torch.where(op.phi > 0, op.phi, torch.ones_like(op.phi))


def mask3d(op) -> torch.Tensor:
    """The mask per band (1|B, C, H, W) (a broadcast view of a 2-D mask)."""
    return op.mask.expand(op.mask.shape[0], op.bands, *op.mask.shape[-2:])


def roll_bands(x: torch.Tensor, offsets: list[int], sign: int = 1) -> torch.Tensor:
    """Band c rolled by sign·d_c along the last axis (the toolbox's ``shift_3d`` / ``shift_back_3d`` with
    torch.roll): (B, C, H, W') -> (B, C, H, W'), one gather."""
    w = x.shape[-1]
    idx = (torch.arange(w, device=x.device)[None, :] - sign * torch.tensor(offsets, device=x.device)[:, None]) % w
    return torch.gather(x, -1, idx[None, :, None, :].expand(x.shape))


# ---------------------------------------------------------------------------------------------- models
class ToolboxModel(Reconstructor):
    """Base of the toolbox's architectures in cassi: ``model(op, y) -> x`` (B, C, H, W) with the inputs of the
    method's template derived inside (module docstring). Subclasses set ``self.config = _config(self,
    dict(locals()))`` and implement ``forward``; :meth:`check`, run when a model first meets an operator, also
    refuses (one line) what the architecture cannot do (:meth:`limits`)."""

    def limits(self, op) -> None:
        """Raise ValueError (one line) for a geometry the architecture cannot handle; default: none."""

    def check(self, op) -> None:
        super().check(op)
        self.limits(op)


# ---------------------------------------------------------------------------------------------- weights
@dataclass
class Method:
    """A toolbox method: the cassi class (a registered name), its arguments, the state-dict key mapping."""
    name: str
    target: str
    kwargs: dict = field(default_factory=dict)
    rename: Callable[[str], str] | None = None
    step: int = 2
    bands: int = 28
    source: str = "mst"  # where its weights come from: scripts/convert_checkpoint.py's source=


METHODS: dict[str, Method] = {}

_MST = "caiyuanhao1998/MST README.md, 'Quantitative Comparison on Simulation Dataset'"
_SAU = "hustvl/SAUNet README.md, 'Results from the paper'"
_DPU = "the DPU paper (Zhang et al., CVPR 2024), as its figures are quoted in cassi's issue 85"
_SSR = "the SSR paper (Zhang et al., CVPR 2024), as its figures are quoted in cassi's issue 85"
#: What the authors publish for each method on KAIST's 10 simulation scenes (the 256² mask, 28 bands, step 2):
#: (mean PSNR dB, mean SSIM or None where not quoted, where it is written). Both metrics per band on 8-bit cubes
#: (cassi.metrics.psnr_table, ssim_table). DPU and SSR publish theirs only in their papers; ssr_m's is not quoted.
REPORTED: dict[str, tuple[float, float | None, str]] = {
    "gap_net": (33.26, 0.917, _MST), "admm_net": (33.58, 0.918, _MST), "hdnet": (34.97, 0.943, _MST),
    "mst_s": (34.26, 0.935, _MST), "mst_m": (34.94, 0.943, _MST), "mst_l": (35.18, 0.948, _MST),
    "mst_plus_plus": (35.99, 0.951, _MST), "dauhst_2stg": (36.34, 0.952, _MST), "dauhst_3stg": (37.21, 0.959, _MST),
    "dauhst_5stg": (37.75, 0.962, _MST), "dauhst_9stg": (38.36, 0.967, _MST),
    "saunet_1stg": (34.84, 0.946, _SAU), "saunet_2stg": (36.73, 0.961, _SAU), "saunet_3stg": (37.54, 0.966, _SAU),
    "saunet_5stg": (38.16, 0.970, _SAU), "saunet_9stg": (38.57, 0.973, _SAU), "saunet_13stg": (38.79, 0.974, _SAU),
    "dpu_5stg": (39.62, None, _DPU), "dpu_9stg": (40.52, 0.977, _DPU),
    "ssr_s": (39.19, None, _SSR), "ssr_l": (40.69, 0.978, _SSR),
}


def reported_beside(method: str | None, psnr_table: float, ssim_table: float, where: str) -> str | None:
    """One line setting a converted model's scores (the published tables' PSNR and SSIM on ``where``) beside what
    its authors report on KAIST; None for a method without reported figures (or no method)."""
    if method not in REPORTED:
        return None
    psnr, ssim, source = REPORTED[method]
    theirs = f"{psnr:.2f} dB" + (f" / {ssim:.3f}" if ssim is not None else "")
    return (f"{method}: {psnr_table:.2f} dB / SSIM {ssim_table:.3f} here ({where}); its authors report {theirs} "
            f"on KAIST's 10 scenes ({source})")


def register_method(name: str, target: str, rename: Callable[[str], str] | None = None, source: str = "mst",
                    **kwargs) -> None:
    """Record the toolbox method ``name`` (e.g. "mst_s"): built as ``target(**kwargs)`` (a registered class
    name); ``rename`` maps each toolbox state-dict key to the class's (default: identity); ``source``: where its
    published weights come from ("mst": the MST toolbox; "dpu": the DPU authors' repository)."""
    if name in METHODS:
        raise ValueError(f"toolbox method {name!r} is already registered")
    METHODS[name] = Method(name, target, dict(kwargs), rename, source=source)


def _numpy_scalars() -> list:
    """The numpy globals that a pickled numpy scalar needs (the DPU authors' checkpoints store their PSNR as a
    numpy float64 beside the weights), allowed to ``weights_only`` loading; none without numpy."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy comes with torch's usual installs
        return []
    scalar = (getattr(np, "_core", None) or np.core).multiarray.scalar
    return [(scalar, "numpy.core.multiarray.scalar"), (scalar, "numpy._core.multiarray.scalar"), np.dtype,
            *(type(np.dtype(t)) for t in ("float64", "float32", "int64"))]


def toolbox_state(weights) -> dict[str, torch.Tensor]:
    """The plain state dict of a toolbox checkpoint (a path or a dict): tensors only, ``module.`` prefixes of
    DataParallel removed; a dict under "state_dict"/"model" is unwrapped. Loaded with weights_only=True (numpy
    scalars allowed: :func:`_numpy_scalars`)."""
    if not isinstance(weights, dict):
        path = Path(weights)
        if not path.is_file():
            raise FileNotFoundError(f"weights file {path} does not exist")
        try:
            with torch.serialization.safe_globals(_numpy_scalars()):
                weights = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - a foreign or truncated file
            raise ValueError(f"{path} is not a torch state dict ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
        if not isinstance(weights, dict):
            raise ValueError(f"{path} holds a {type(weights).__name__}, not a state dict")
    for key in ("state_dict", "model"):
        if isinstance(weights.get(key), dict):
            weights = weights[key]
    return {re.sub(r"^(module\.)+", "", k): v for k, v in weights.items() if isinstance(v, torch.Tensor)}


def build(method: str) -> nn.Module:
    """The cassi model of toolbox method ``method`` with fresh weights."""
    if method not in METHODS:
        raise ValueError(f"unknown toolbox method {method!r}; known: {sorted(METHODS)}")
    m = METHODS[method]
    return resolve(m.target, nn.Module, "model class")(**m.kwargs)


def load_toolbox_weights(model: nn.Module, method: str, weights, where: str = "weights") -> nn.Module:
    """Load the toolbox state dict ``weights`` (path or dict) of ``method`` into ``model`` (strict); ValueError
    naming the missing and unexpected keys."""
    m = METHODS[method]
    state = toolbox_state(weights)
    if m.rename is not None:
        state = {m.rename(k): v for k, v in state.items()}
    missing, unexpected = [], []
    own = model.state_dict()
    missing = sorted(own.keys() - state.keys())
    unexpected = sorted(state.keys() - own.keys())
    if missing or unexpected:
        raise ValueError(f"{where} do not fit toolbox method {method!r}: missing {missing[:4]}"
                         f"{'...' if len(missing) > 4 else ''}, unexpected {unexpected[:4]}"
                         f"{'...' if len(unexpected) > 4 else ''} (is it another method's checkpoint?)")
    shapes = [k for k in own if own[k].shape != state[k].shape]
    if shapes:
        k = shapes[0]
        raise ValueError(f"{where} do not fit toolbox method {method!r}: {k} is {tuple(state[k].shape)} there, "
                         f"{tuple(own[k].shape)} here")
    model.load_state_dict(state, strict=True)
    return model


def convert(method: str, weights, out, wavelengths=None) -> Path:
    """Write a cassi checkpoint (atomically) of toolbox method ``method`` from its ``.pth`` (or ``.pkl``)
    ``weights``: the model's config, the toolbox's geometry (integer step 2 along w, 28 bands unless the method
    says otherwise), the source (where from, method, file, sha256). It loads with ``cassi.models.load_model``
    and ``ckpt=`` everywhere."""
    from cassi.io import write_text_atomic

    model = build(method)
    load_toolbox_weights(model, method, weights, where=str(weights))
    m = METHODS[method]
    digest = hashlib.sha256(Path(weights).read_bytes()).hexdigest() if not isinstance(weights, dict) else None
    info = {"model": dict(model.config),
            "geometry": {"offsets": [float(c * m.step) for c in range(m.bands)], "axis": "w", "bands": m.bands},
            "wavelengths": None if wavelengths is None else [float(w) for w in wavelengths],
            "converted": {"source": m.source, "method": method, "file": str(weights), "sha256": digest}}
    state = {f"reconstructor.{k}": v for k, v in model.state_dict().items()}
    buf = io.BytesIO()
    torch.save({"cassi": info, "state_dict": state}, buf)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, buf.getvalue())
    return out


def seeded_state(model: nn.Module, seed: int = 0, scale: float = 0.1) -> dict[str, torch.Tensor]:
    """A reproducible stand-in for trained weights: every floating tensor of ``model``'s state dict, in key
    order, filled from one seeded generator (uniform in ±scale·√(3/fan_in)-like bounds: ``scale`` /
    √(numel of one output slice)); integer buffers kept. Used to compare with the toolbox's code."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k, v in model.state_dict().items():
        if not v.is_floating_point():
            out[k] = v.clone()
            continue
        if k.endswith("running_var"):  # BatchNorm variances must stay positive
            out[k] = (0.5 + torch.rand(v.shape, generator=gen, dtype=torch.float64)).to(v.dtype)
            continue
        fan = max(1, v[0].numel() if v.ndim > 1 else 1)
        r = torch.rand(v.shape, generator=gen, dtype=torch.float64) * 2 - 1
        out[k] = (r * scale * math.sqrt(3.0 / fan) * (3 if v.ndim > 1 else 1)).to(v.dtype)
    return out


# ---------------------------------------------------------------------------------------------- training
def multistep(optimizer: torch.optim.Optimizer, milestones, gamma: float = 0.5, epoch_steps: int = 1000,
              warmup_steps: int = 0, min_lr: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """The toolbox's MultiStepLR as a per-step schedule (``module.scheduler``, stepped every optimizer step):
    lr_t = lr·γ^(number of ``milestones`` ≤ t/``epoch_steps``), milestones in epochs (the toolbox's epoch is
    5000 samples: 1000 steps at batch 5); linear warm-up over ``warmup_steps``; never below ``min_lr``. Takes
    the keys of conf/train.yaml's cosine schedule (warmup_steps, min_lr) so that an experiment can swap it in."""
    marks = sorted(float(m) for m in milestones)
    if epoch_steps < 1 or warmup_steps < 0 or gamma <= 0:
        raise ValueError(f"need epoch_steps >= 1, warmup_steps >= 0, gamma > 0, got {epoch_steps}, {warmup_steps}, "
                         f"{gamma}")
    base = [g["lr"] for g in optimizer.param_groups]

    def factor(step: int, lr: float) -> float:
        f = gamma ** sum(step >= m * epoch_steps for m in marks)
        if step < warmup_steps:
            f *= (step + 1) / warmup_steps
        return max(f, min(min_lr / lr, 1.0)) if lr > 0 and step >= warmup_steps else f

    return torch.optim.lr_scheduler.LambdaLR(optimizer, [lambda s, lr=lr: factor(s, lr) for lr in base])
