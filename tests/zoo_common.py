"""Shared by the zoo tests and tests/make_zoo_reference.py: seeded scenes, masks and weights, and the compact
reference outputs of the MST toolbox's code (tests/data/zoo/<method>.pt).

A reference holds no weights and no code: the test regenerates the weights from a seed
(cassi.models.zoo.toolbox.seeded_state, in the cassi model's key order) and the scene and mask from seeds; the
file stores the toolbox model's output at seeded sample positions, its per-band means, its peak, and the
toolbox's state-dict keys (to rebuild a toolbox-format .pth for the conversion test).
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import torch

from cassi import CASSI
from cassi.models.zoo import toolbox

REF_DIR = Path(__file__).parent / "data" / "zoo"
SAMPLES = 4096  # output positions stored per reference


def scene(shape, seed: int = 1) -> torch.Tensor:
    """A seeded cube (1, C, H, W) in [0, 1): smooth along bands, so that models see a plausible spectrum."""
    g = torch.Generator().manual_seed(seed)
    c, h, w = shape
    base = torch.rand(1, 4, h, w, generator=g)
    weights = torch.rand(c, 4, generator=g)
    x = torch.einsum("ck,bkhw->bchw", weights / weights.sum(1, keepdim=True), base)
    return (0.7 * x + 0.3 * torch.rand(1, c, h, w, generator=g)).float()


def mask(shape, seed: int = 2) -> torch.Tensor:
    """A seeded Bernoulli(0.5) mask (H, W), float32."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) > 0.5).float()


def positions(shape, seed: int = 3, n: int = SAMPLES) -> torch.Tensor:
    """n seeded flat indices into an output of ``shape`` (C, H, W)."""
    g = torch.Generator().manual_seed(seed)
    total = int(torch.tensor(shape).prod())
    return torch.randint(0, total, (n,), generator=g)


def summary(out: torch.Tensor, seed: int = 3) -> dict:
    """{"values": out at seeded positions (float32), "band_mean": per-band means (float64), "peak"}."""
    o = out.detach()[0].double()
    return {"values": o.flatten()[positions(o.shape, seed)].float(), "band_mean": o.mean(dim=(1, 2)),
            "peak": float(o.abs().max())}


def load_reference(method: str) -> dict:
    return torch.load(REF_DIR / f"{method}.pt", map_location="cpu", weights_only=True)


def cassi_output(method: str, ref: dict, model=None) -> torch.Tensor:
    """The cassi model of ``method`` (seeded weights unless ``model`` is given) on the reference's scene."""
    c, h, w = ref["shape"]
    x = scene((c, h, w), ref["scene_seed"])
    op = CASSI(mask((h, w), ref["mask_seed"]), bands=c, step=2)
    if model is None:
        model = toolbox.build(method)
        model.load_state_dict(toolbox.seeded_state(model, ref["weight_seed"]))
    with torch.no_grad():
        return model.eval()(op, op(x))


def assert_matches(out: torch.Tensor, ref: dict, tol: float = 1e-4) -> None:
    """``out`` equals the toolbox's output within ``tol`` of its peak at every stored position and per band."""
    got = summary(out, ref["positions_seed"])
    assert tuple(out.shape[1:]) == tuple(ref["shape"]), (tuple(out.shape), ref["shape"])
    bound = tol * ref["peak"]
    err = (got["values"].double() - ref["values"].double()).abs().max().item()
    assert err <= bound, f"max error {err:.3g} at sampled positions > {bound:.3g} (1e-4 of the peak {ref['peak']:.4g})"
    err = (got["band_mean"] - ref["band_mean"]).abs().max().item()
    assert err <= bound, f"per-band mean error {err:.3g} > {bound:.3g}"


def swapped(state: dict, pairs) -> dict:
    """``state`` with the tensors of each key pair (a, b) exchanged: a key mapping that confuses the two (a
    negative control's wrong weights). The two must have one shape and differ."""
    out = dict(state)
    for a, b in pairs:
        assert state[a].shape == state[b].shape and not torch.equal(state[a], state[b]), (a, b)
        out[a], out[b] = state[b], state[a]
    return out


def assert_fails_the_check(out: torch.Tensor, ref: dict) -> None:
    """Negative control: :func:`assert_matches`, the equality tests' check, rejects ``out`` on its values (not on
    its shape): the check can tell these weights from the right ones."""
    import pytest

    with pytest.raises(AssertionError, match="max error|per-band mean error"):
        assert_matches(out, ref)


def toolbox_checkpoint(method: str, ref: dict, path: Path, prefix: str = "module.") -> Path:
    """A toolbox-format .pth (its key names, ``prefix`` as DataParallel writes) holding the seeded weights."""
    model = toolbox.build(method)
    seeded = toolbox.seeded_state(model, ref["weight_seed"])
    rename = toolbox.METHODS[method].rename or (lambda k: k)
    torch.save({prefix + k: seeded[rename(k)] for k in ref["toolbox_keys"]}, path)
    return path


def train_one_step(tmp_path: Path, *model: str, threads: str | None = None) -> None:
    """``scripts/train.py`` with ``model`` overrides (e.g. "model=mst_s", "model.num_blocks=[1,1,1]") on tiny
    synthetic data (6 bands, 16² scenes), one ``fast_dev_run`` step; asserts it ran."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    tiny = [*model, "bands=6", "wavelengths=null", "data.train.n=4", "data.val.n=1", "data.test.n=1",
            "data.batch_size=2", "trainer.accelerator=cpu", "trainer.fast_dev_run=1", "callbacks.progress=null",
            "callbacks.summary=null",
            *(f"data.{s}.{k}=16" for s in ("train", "val", "test") for k in ("height", "width")),
            f"paths.output_dir={tmp_path}", f"hydra.run.dir={tmp_path}"]
    env = dict(os.environ, PYTHONWARNINGS="ignore", **({"OMP_NUM_THREADS": threads} if threads else {}))
    r = subprocess.run([sys.executable, str(root / "scripts" / "train.py"), *tiny], cwd=root, capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Running in `fast_dev_run` mode" in r.stdout + r.stderr


# ------------------------------------------------------------------ beyond the authors' code (DPU, SSR, SAUNet)
GEOMETRIES = ["31 bands 9×14", "step 1", "uneven offsets", "a mask per sample", "1×3 frame"]


def check_geometry(small, case: str) -> None:
    """``small(bands)`` (a 2-stage model with ``return_stages``) on a geometry its authors' code does not take:
    every stage's output finite and of x's shape, and a batch equal to its samples."""
    g = torch.Generator().manual_seed(1)
    bands, shape, kw = 5, (12, 20), {"step": 2}
    if case.startswith("31"):
        bands, shape = 31, (9, 14)
    elif case == "step 1":
        kw = {"step": 1}
    elif case.startswith("uneven"):
        kw = {"offsets": [0, 3, 4, 9, 1]}
    elif case.startswith("1×3"):
        shape = (1, 3)
    mask = torch.rand(2, 1, *shape, generator=g) if case.startswith("a mask") else torch.rand(*shape, generator=g)
    kw["backend"] = "loop"  # the operator only makes y here: no backend selection per geometry
    op = CASSI(mask, bands=bands, **kw)
    x = torch.rand(2, bands, *shape, generator=g)
    y = op(x)
    model = small(bands)
    with torch.no_grad():
        outs = model(op, y, return_stages=True)
        assert len(outs) == 2 and all(o.shape == x.shape for o in outs) and torch.isfinite(outs[-1]).all()
        one = model(op if mask.ndim == 2 else CASSI(mask[1:], bands=bands, **kw), y[1:])
    torch.testing.assert_close(one, outs[-1][1:], rtol=1e-4, atol=1e-5)  # a batch is its samples (rounding aside)


def check_axis_h_and_refusals(model, name: str) -> None:
    """A 5-band ``model``: dispersion along h is the transposed problem along w; fractional offsets and another band
    count are refused, naming the model's class ``name``."""
    import pytest

    g = torch.Generator().manual_seed(2)
    mask = (torch.rand(20, 12, generator=g) > 0.5).float()
    x = torch.rand(1, 5, 20, 12, generator=g)
    op_h = CASSI(mask, bands=5, step=2, axis="h", backend="loop")
    op_w = CASSI(mask.t().contiguous(), bands=5, step=2, backend="loop")
    with torch.no_grad():
        a = model(op_h, op_h(x))
        b = model(op_w, op_w(x.transpose(-1, -2).contiguous()))
    torch.testing.assert_close(a, b.transpose(-1, -2), rtol=1e-5, atol=1e-6)
    op = CASSI(mask, bands=5, step=1.5, backend="loop")
    with pytest.raises(ValueError, match=rf"^this {name} works on the dispersed frame, which needs integer offsets"):
        model(op, op(x))
    with pytest.raises(ValueError, match="reconstructs 5 bands but the operator has 4"):
        model(CASSI(mask, bands=4), torch.zeros(1, 1, 20, 18))

def digest(state: dict) -> str:
    """sha256 of a state dict's tensors in key order (their float32 bytes)."""
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def stage_keys(pattern: list[str], stages: int, step: str, nets: int) -> list[str]:
    """The authors' state-dict keys of a ``stages``-stage unrolled Net from those of its first stage (``pattern``:
    the shared keys, those of ``<step>.0`` and of ``net_stage.0`` … ``net_stage.<nets - 1>``)."""
    out = [k for k in pattern if not k.startswith((f"{step}.", "net_stage."))]
    for s in range(stages):
        for k in pattern:
            if k.startswith(f"{step}.0."):
                out.append(f"{step}.{s}." + k[len(f"{step}.0."):])
            m = re.match(r"net_stage\.(\d)\.(.+)", k)
            if m:
                out.append(f"net_stage.{nets * s + int(m.group(1))}.{m.group(2)}")
    return out
