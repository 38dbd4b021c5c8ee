"""A learned correction of an iterative solver: x = x₀ + s·U([x₀, r] / s), with x₀ = solver(op, y) (GAP-TV by
default), r = A⁺(y − A x₀) what x₀ leaves unexplained of the measurement, and s = mean(x₀)/0.5 per sample.

The solver does the global part of the inversion (every pixel's spectrum is spread over 2·(C−1)+1
columns of y), so the network only corrects local errors: it can be trained on small windows of
precomputed (x, x₀, r) — no operator and no solver in the training loop (``cassi.data.FirstIterates``).

    model = Refiner(bands=28)                 # model(op, y) -> (B, C, H, W), like a solver
    pool = FirstIterates(cubes, simulator, model.solver_spec, patch_size=64, samples_per_epoch=4096)
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from cassi.data.first_iterates import scene_scale as _scale
from cassi.models.blocks import UNet, widen_state
from cassi.models.unrolled import Unrolled, _config, _plain
from cassi.models.zoo.dauhst import HSTPrior
from cassi.models.zoo.mst import SpectralUNet
from cassi.registry import register
from cassi.solvers.base import DEFAULT_SOLVER, Solver, build_solver

__all__ = ["Refiner", "build_solver", "DEFAULT_SOLVER", "spectral_interp", "stage_shapes", "transfer_weights"]

log = logging.getLogger(__name__)
# a stage's network, (B, 2C [+1], H, W) -> (B, C, H, W)
_PRIORS = {"unet": UNet, "mst": SpectralUNet, "hst": HSTPrior}
# each network's first layer (reads [x, r, mask?]) and last layer (writes C bands), by name: UNet, SpectralUNet, HSTPrior
_FIRST = {"down.0.0.weight", "head.weight", "embed.weight"}
_LAST = {"last.weight", "last.bias", "mapping.weight"}


def stage_shapes(config: dict) -> list[tuple[int, int]]:
    """(width, depth) of each stage's U-Net from a Refiner's config (``width``/``depth``: one int for all
    stages or a list with one per stage); ValueError naming the argument when a list has another length."""
    stages, out = config["stages"], []
    for name in ("width", "depth"):
        v = config[name] if isinstance(config[name], (list, tuple)) else [config[name]] * stages
        if len(v) != stages or not all(isinstance(i, int) and i >= 1 for i in v):
            raise ValueError(f"Refiner {name} must be a positive int or a list of {stages} (one per stage), "
                             f"got {config[name]!r}")
        out.append(v)
    return list(zip(*out))


def spectral_interp(src, dst) -> torch.Tensor:
    """Q (len(dst), len(src)): linear interpolation of spectra sampled at the increasing wavelengths ``src`` onto
    ``dst`` (each row sums to 1; beyond the ends, the end band): x_dst = Q x_src."""
    src, dst = torch.as_tensor(src, dtype=torch.float64), torch.as_tensor(dst, dtype=torch.float64)
    if src.dim() != 1 or dst.dim() != 1 or not len(src) or not len(dst) or (src[1:] <= src[:-1]).any():
        raise ValueError(f"spectral_interp needs two 1-D grids, src increasing; got {src.tolist()}, {dst.tolist()}")
    q = torch.zeros(len(dst), len(src), dtype=torch.float64)
    if len(src) == 1:
        return q + 1
    hi = torch.searchsorted(src, dst).clamp(1, len(src) - 1)
    t = ((dst - src[hi - 1]) / (src[hi] - src[hi - 1])).clamp(0, 1)
    rows = torch.arange(len(dst))
    q[rows, hi - 1] = 1 - t
    q[rows, hi] += t
    return q


def transfer_weights(state: dict, bands: tuple[int, int], wavelengths: tuple | None = None,
                     transpose: bool = False) -> dict:
    """A Refiner's state dict carried to another camera: each U-Net's band-wise inputs (x and r, the first
    convolution) and outputs (the last one) resampled from ``bands[0]`` to ``bands[1]`` bands by linear
    interpolation across wavelength, and with ``transpose`` every kernel transposed and every attention position table
    permuted to match (a dispersion along the other axis: the network conjugated by the swap of H and W, exact). Inputs: W' = W·P with P = spectral_interp(to,
    from) (what the old bands would see of the new ones); outputs: W' = Q·W, b' = Q·b with Q = spectral_interp(from,
    to). ``wavelengths``: (nm of the old bands, nm of the new), or None (band positions, evenly spread)."""
    c0, c1 = bands
    nm0, nm1 = wavelengths if wavelengths is not None and None not in wavelengths else (
        torch.linspace(0, 1, c0), torch.linspace(0, 1, c1))
    if len(nm0) != c0 or len(nm1) != c1:
        raise ValueError(f"transfer_weights: {len(nm0)} and {len(nm1)} wavelengths for {c0} and {c1} bands")
    p, q = spectral_interp(nm1, nm0), spectral_interp(nm0, nm1)  # (c0, c1), (c1, c0)
    out = {}
    for key, w in state.items():
        w = w.clone()
        name = key.split(".", 2)[2] if key.startswith("priors.") else ""  # the weight's name in its stage's network
        if name in _FIRST:  # [x, r, mask?]
            if w.shape[1] not in (2 * c0, 2 * c0 + 1):
                raise ValueError(f"transfer_weights: {key} has {w.shape[1]} inputs, not 2·{c0} (+1)")
            parts = [torch.einsum("oskl,sd->odkl", w[:, i * c0:(i + 1) * c0].double(), p).to(w.dtype) for i in (0, 1)]
            w = torch.cat([*parts, w[:, 2 * c0:]], dim=1)
        elif name in _LAST:
            if w.shape[0] != c0:
                raise ValueError(f"transfer_weights: {key} has {w.shape[0]} outputs, not {c0}")
            w = torch.einsum("ds,s...->d...", q, w.double()).to(w.dtype)
        if transpose and name.endswith(("attn.bias", "local_bias", "shuffle_bias")):  # HST's position tables
            w = _transposed_positions(w, key)
        elif transpose and w.dim() == 4:
            w = w.transpose(-1, -2)
        out[key] = w.contiguous()
    return out


def _transposed_positions(table: torch.Tensor, key: str) -> torch.Tensor:
    """An attention's (…, n, n) position table, n = s² positions of an s×s window (or grid) in row-major order,
    for the transposed image: new[…, p, q] = old[…, pᵀ, qᵀ] with (i, j)ᵀ = (j, i)."""
    s = int(round(table.shape[-1] ** 0.5))
    if s * s != table.shape[-1] or table.shape[-1] != table.shape[-2]:
        raise ValueError(f"transfer_weights: {key} {tuple(table.shape)} is not a table over a square grid; "
                         f"only those can be transposed")
    t = torch.arange(s * s).view(s, s).t().reshape(-1)
    return table[..., t[:, None], t[None, :]].contiguous()


@register
class Refiner(Unrolled):
    """x_k = x_{k−1} + s_k·U_k([x_{k−1}, r_{k−1}]/s_k), k = 1..K: residual U-Nets correcting a solver's
    reconstruction x₀, each from what the last estimate leaves of the measurement, r = A⁺(y − A x).

    Args:
        bands: C.
        stages: K, the number of corrections (each with its own U-Net).
        width, depth: each U-Net (widths ``width``·2^s over ``depth`` scales; input 2C channels); a list gives
            one value per stage (e.g. ``depth=[4, 4, 5]``: a third stage with one more scale).
        solver: the first iterate's solver as {"_target_": class path, **arguments} (stored in checkpoints;
            default: the shipped GAP-TV, :data:`DEFAULT_SOLVER`). It runs without gradients.
        checkpointing: recompute the U-Nets' activations in backward.
        project: make every stage's output consistent with y, x_k = x̃_k + r̃_k with x̃_k the correction above and
            r̃_k = A⁺(y − A x̃_k) (the GAP projection; the next stage sees (x_k, r̃_k)). For noiseless or lightly
            noisy measurements (measured: docs/training.md, "The ladder: what each lever gave `cave_tsa`"); with
            noise it fits the noise.
        prior: each stage's network: ``"unet"`` (convolutional, :class:`cassi.models.blocks.UNet`) or ``"mst"``
            (MST's spectral-wise attention blocks in a U-Net, :class:`cassi.models.zoo.mst.SpectralUNet`; ``width``
            is its first level's channels and head size, ``depth`` its levels + 1) or ``"hst"`` (DAUHST's
            half-shuffle transformer, :class:`cassi.models.zoo.dauhst.HSTPrior`; ``width`` its heads' size,
            ``depth`` its scales).
        mask_input: each U-Net also sees the mask where the window lies, M (B, 1, H, W) (the mean over bands of a
            per-band mask): input 2C + 1 channels, [x/s, r/s, M]. GAP-TV's errors follow the mask's pattern.
        flip_ensemble: in ``forward``, a stage's correction is the mean of the correction of x and the mirrored
            correction of x mirrored across the dispersion (along h when it runs along w; a mirror along it would
            reverse it), one batch of 2B: twice that U-Net's cost. True: every stage; a list: those stages (0-based;
            cave_tsa: [0], since the mirror on every stage adds next to nothing more on validation; measured:
            cassi/pretrained/cave_tsa.md, "Data and recipe", step 9).

    ``model(op, y)`` (B, 1, H, W+Δ) -> (B, C, H, W); ``return_stages=True`` gives [x₀, x₁, …, x_K].
    ``refine(x, r, scale, stage)`` is one learned correction alone (what ``cassi.data.FirstIterates`` windows
    train, one stage at a time). s_k = mean(x_{k−1})/0.5 per sample, so the output is brightness-equivariant
    whenever the solver is (GAP-TV is not exactly: its TV weight is absolute).
    """

    def __init__(self, bands: int = 28, stages: int = 1, width: int | list[int] = 16, depth: int | list[int] = 4,
                 solver: dict | None = None, checkpointing: bool = False, project: bool = False,
                 flip_ensemble: bool | list[int] = False, mask_input: bool = False, prior: str = "unet"):
        super().__init__(bands, stages, False, checkpointing, normalize=True)
        self.project, self.mask_input = bool(project), bool(mask_input)
        self.flip_ensemble = _plain(flip_ensemble)  # a ListConfig becomes a list
        flip_ensemble = self.flip_ensemble
        if not isinstance(flip_ensemble, bool) and not (
                isinstance(flip_ensemble, list) and all(isinstance(k, int) and not isinstance(k, bool)
                                                        and 0 <= k < stages for k in flip_ensemble)):
            raise ValueError(f"flip_ensemble must be true, false or a list of stages in 0..{stages - 1}, "
                             f"got {flip_ensemble!r}")
        if isinstance(solver, Solver):
            raise ValueError(f"solver must be a config {{'_target_': ..., **arguments}} (stored in checkpoints), "
                             f"got the object {solver!r}; from Hydra, instantiate the model with _recursive_=False")
        solver = _plain(DEFAULT_SOLVER if solver is None else solver)
        self.solver = build_solver(solver)
        self.solver_spec = solver
        self.config = _config(self, dict(locals()))
        if prior not in _PRIORS:
            raise ValueError(f"Refiner prior must be one of {sorted(_PRIORS)}, got {prior!r}")
        net = _PRIORS[prior]
        self.priors = nn.ModuleList(net(2 * bands + self.mask_input, bands, w, d) for w, d in stage_shapes(self.config))

    def first(self, op, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x₀, r₀) = (solver(op, y), A⁺(y − A x₀)), both (B, C, H, W), without gradients."""
        with torch.no_grad():
            x0 = self.solver(op, y.detach()).x
            return x0, op.pinv(y.detach() - op(x0))

    def refine(self, x: torch.Tensor, r: torch.Tensor, scale: torch.Tensor | None = None,
               stage: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
        """x + s·U_stage([x, r]/s) (B, C, H, W); ``scale`` s (B, 1, 1, 1) defaults to mean(x)/0.5 (give the
        whole scene's when x is a window of it); ``mask`` (1|B, 1|C, H, W), the mask over x: needed with
        ``mask_input``, else ignored."""
        s = _scale(x) if scale is None else scale.to(x.dtype)
        net = self.priors[stage]
        parts = [x / s, r / s]
        if self.mask_input:
            if mask is None or mask.shape[-2:] != x.shape[-2:]:
                raise ValueError(f"this Refiner (mask_input=true) needs the mask over x {tuple(x.shape)}, got "
                                 f"{None if mask is None else tuple(mask.shape)}")
            m = mask.to(x.dtype).mean(dim=1, keepdim=True)
            parts.append(m.expand(x.shape[0], 1, *x.shape[-2:]))
        # channels_last: the CPU convolutions run faster on it (measured: docs/training.md, "The Refiner recipe")
        inp = torch.cat(parts, dim=1).contiguous(memory_format=torch.channels_last)
        if self.checkpointing and torch.is_grad_enabled():
            out = torch.utils.checkpoint.checkpoint(net, inp, use_reentrant=False)
        else:
            out = net(inp)
        return out.contiguous().to(x.dtype) * s

    def correct(self, x: torch.Tensor, r: torch.Tensor, stage: int, axis: str = "w",
                scale: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                ensemble: bool = True) -> torch.Tensor:
        """Stage ``stage``'s correction (B, C, H, W): :meth:`refine`, or with ``flip_ensemble`` on this stage (and
        ``ensemble``) the mean over x and x mirrored across the dispersion ``axis`` (one batch of 2B, the same s)."""
        which = self.flip_ensemble
        if not ensemble or not (which is True or (not isinstance(which, bool) and stage in which)):
            return self.refine(x, r, scale, stage=stage, mask=mask)
        b, dim = x.shape[0], -1 if axis == "h" else -2
        s = (_scale(x) if scale is None else scale.to(x.dtype)).repeat(2, 1, 1, 1)
        if mask is not None:
            mask = mask.expand(b, *mask.shape[1:])
            mask = torch.cat([mask, mask.flip(dim)])
        both = self.refine(torch.cat([x, x.flip(dim)]), torch.cat([r, r.flip(dim)]), s, stage=stage, mask=mask)
        return 0.5 * (both[:b] + both[b:].flip(dim))

    def forward(self, op, y: torch.Tensor, gt: torch.Tensor | None = None, return_stages: bool = False):
        """x_K (B, C, H, W) from y (B, 1, H, W+Δ); with ``return_stages`` [x₀, …, x_K]. ``gt`` is ignored."""
        x, r = self.first(op, y)
        outs = [x]
        for k in range(self.stages):
            x, r = self.step(op, y, x, r, k, residual=k < self.stages - 1)  # the last x needs no residual
            outs.append(x)
        return outs if return_stages else outs[-1]

    def forward_windows(self, batch: dict, operator) -> torch.Tensor:
        """The output (B, C, h, w) on a training batch of windows of first iterates (:class:`cassi.data.FirstIterates`:
        x, x0, r, mask, scale[, stage, noise]; ``operator(mask=...)`` builds the windows' operator), what
        :class:`cassi.lightning.TrainingModule` trains: stages ``batch["stage"]`` (the stage the windows feed; default
        the last) to K, end to end, each projected onto the window's own measurement y = A x + n when ``project``
        (x̃ + A⁺(y − A x̃), what survives the projection is trained) and feeding the next stage (x̃ or its
        projection, r = A⁺(y − A x̃)); n is the scene's measurement noise there (none without ``batch["noise"]``),
        so that a noisy camera's later stages learn from residuals as noisy as at inference (measured:
        docs/camera.md, "How the plan was chosen"); s is the scene's scale of x₀ throughout.
        Windows from a pool of fewer stages than the model (``data.train.stages=1 model.stages=2``) thus train
        every later stage together, each plainly: a ``flip_ensemble`` is for inference (trained with it, a fit
        makes fewer steps in its time and reads less on its validation windows; docs/camera.md, same section)."""
        x, s = batch["x"], batch.get("scale")
        last = self.stages - 1
        first = int(batch["stage"][0]) if "stage" in batch else last
        if not 0 <= first <= last:
            raise ValueError(f"windows feed stage {first + 1} but the model has {self.stages} stage(s): train a "
                             f"model of at least {first + 1} stages on them (model.stages)")
        op = operator(mask=batch["mask"]) if self.project or first < last else None
        y = None if op is None else op(x) + batch.get("noise", 0)  # the window as a scene, with its noise
        est, r = batch["x0"], batch["r"]
        for k in range(first, last):
            est, r = self.step(op, y, est, r, k, scale=s, ensemble=False)
        out = self.refine(est, r, s, stage=last, mask=batch.get("mask"))
        return op.data_step(out, y) if self.project else out  # ρ = 0: the GAP projection, one fused pass

    def step(self, op, y: torch.Tensor, x: torch.Tensor, r: torch.Tensor, stage: int, residual: bool = True,
             scale: torch.Tensor | None = None, ensemble: bool = True):
        """Stage ``stage``: x̃ = correct(x, r) and what it leaves of y, r' = A⁺(y − A x̃) (None unless
        ``residual``); returns (x̃ + r' with ``project``, else x̃; r'), both (B, C, H, W). ``scale``: s (B, 1, 1, 1)
        when x is a window of a larger scene (default mean(x)/0.5); ``ensemble=False``: without ``flip_ensemble``."""
        x = self.correct(x, r, stage, op.axis, scale, op.mask if self.mask_input else None, ensemble)
        if not (residual or self.project):
            return x, None
        r = op.pinv(y - op(x))
        return (x + r if self.project else x), (r if residual else None)

    # ------------------------------------------------------------------ warm starts
    def load_warm_start(self, trained: nn.Module, path: str, axis: str | None = None,
                        wavelengths=None) -> None:
        """Copy the weights of ``trained`` (the checkpoint ``path``'s model) into this Refiner (the TrainingModule's
        ``init_weights=`` hook; ValueError when they cannot fit). It may have more stages than the checkpoint's: its
        first stages start from those (stage-wise training, see ``cassi.data.FirstIterates``), the others fresh; or
        fewer: it starts from the checkpoint's first stages; another first-iterate solver, ``project`` or
        ``flip_ensemble``; U-Nets wider than the checkpoint's (``cassi.models.blocks.widen_state``); and another
        camera: another band count (its U-Nets' band-wise weights interpolated across wavelength) or dispersion
        axis (kernels transposed), :func:`transfer_weights`. ``axis``, ``wavelengths``: this run's dispersion axis
        and nm per band (None: taken as the checkpoint's)."""
        config = self.config
        # its first iterate and how stages chain are not in the weights
        ignore = {"checkpointing", "project", "solver", "flip_ensemble", "bands", "stages"}
        k_have, k_want = trained.config.get("stages", 1), config.get("stages", 1)  # stages there, here
        state = self._carried(trained, trained.state_dict(), path, axis, wavelengths)
        want = {k: v for k, v in config.items() if k not in ignore}
        have = {k: v for k, v in trained.config.items() if k not in ignore}
        wide = narrow = []  # (width, depth) per stage, here and there, over the stages both have
        if type(trained) is type(self):  # U-Nets: stage by stage, over the stages both have
            shared = min(k_have, k_want)
            wide, narrow = stage_shapes(config)[:shared], stage_shapes(trained.config)[:shared]
            for d, shapes in ((want, wide), (have, narrow)):
                del d["width"], d["depth"]
                d["depth per stage"] = [depth for _, depth in shapes]
            # a U-Net may be wider here than there (widened), not narrower
            want["width per stage (not below the checkpoint's)"] = [w for w, _ in wide]
            have["width per stage (not below the checkpoint's)"] = [max(w, n) for (w, _), (n, _) in zip(wide, narrow)]
            if k_have > k_want:  # its first stages
                state = {n: v for n, v in state.items() if not n.startswith("priors.") or int(n.split(".")[1]) < k_want}
                log.info(f"init_weights={path}: its first {k_want} of {k_have} stages")
        if want != have:
            diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
            raise ValueError(f"init_weights={path}: its model differs from the configured one in "
                             + ", ".join(f"{k} ({have.get(k)!r} there, {want.get(k)!r} here)" for k in diff))
        state = self._widened(state, wide, narrow, path)  # once the shapes are known to fit
        missing = self.load_state_dict(state, strict=False).missing_keys
        # the stages the checkpoint lacks start fresh; every other weight must come from it
        missing = [m for m in missing if not (m.startswith("priors.") and int(m.split(".")[1]) >= k_have)]
        if missing:
            raise ValueError(f"init_weights={path}: no weights for {missing[:3]}")

    def _widened(self, state: dict, wide: list, narrow: list, path: str) -> dict:
        """``state`` with each stage's U-Net embedded in this Refiner's wider one (``cassi.models.blocks.widen_state``:
        the same function, the new channels silent), one log line naming the widths."""
        grown = [k for k, ((w, _), (n, _)) in enumerate(zip(wide, narrow)) if w > n]
        if grown and not isinstance(self.priors[0], UNet):
            raise ValueError(f"init_weights={path}: only U-Net stages can be widened (prior={self.config['prior']!r})")
        for k in grown:
            prefix = f"priors.{k}."
            old = {n[len(prefix):]: v for n, v in state.items() if n.startswith(prefix)}
            state = {**state, **{prefix + n: v for n, v in widen_state(old, self.priors[k]).items()}}
        if grown:
            log.info(f"init_weights={path}: U-Nets of stages {[k + 1 for k in grown]} widened from width "
                     f"{[narrow[k][0] for k in grown]} to {[wide[k][0] for k in grown]} (new channels start silent: "
                     f"the same function)")
        return state

    def _carried(self, trained: nn.Module, state: dict, path: str, axis: str | None, wavelengths) -> dict:
        """``trained``'s weights ``state`` for this Refiner's band count, the wavelengths and dispersion ``axis``
        (unchanged when they are the same), with one log line saying what was carried over."""
        bands = self.config["bands"]
        old_axis = (trained.geometry or {}).get("axis") or axis
        axis = axis or old_axis  # one of them unknown: taken as the same
        old_nm, new_nm = trained.wavelengths, wavelengths
        if trained.bands == bands and old_axis == axis and (old_nm is None or new_nm is None or
                                                            list(old_nm) == list(new_nm)):
            return state
        known = old_nm is not None and new_nm is not None
        log.info(f"init_weights={path}: carried from {trained.bands} to {bands} bands "
                 f"({'interpolated across wavelength' if known else 'by band position: wavelengths not known'})"
                 + (f", dispersion along {old_axis} to {axis} (kernels transposed)" if old_axis != axis else ""))
        return transfer_weights(state, (trained.bands, bands), (old_nm, new_nm), old_axis != axis)
