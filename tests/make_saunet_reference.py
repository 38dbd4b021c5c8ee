"""Make tests/data/zoo/saunet_1stg.pt by running the SAUNet authors' own code on CPU (a developer's tool, not a test).

    .venv/bin/python tests/make_saunet_reference.py <SAUNet checkout or its git dir> [--size 9]

<SAUNet checkout> is a clone of GitHub hustvl/SAUNet (MIT licence; not shipped with cassi), or a bare git directory
of it (its ``model/`` package is read from HEAD). Its model is built by its own ``model_generator("saunet_Kstg")``
(its ``.cuda()`` calls become no-ops in this process; ``timm``, which it imports only for DropPath, is replaced by
a stand-in that is the identity in eval mode, as timm's is: the 1-stage model has no drop path at all). It gets the
seeded weights of cassi's :class:`~cassi.models.zoo.saunet.SAUNet` (``toolbox.seeded_state`` of the weight seed,
mapped through :func:`~cassi.models.zoo.saunet.authors_key`) and the inputs its ``simu_test.py`` gives it (the
measurement, the mask placed per band and Σ of its squares with zeros set to 1) on the scene and mask of
tests/zoo_common.py, with the measurement computed by cassi's operator (``op(x)``, its ``loop`` backend: the y
that the test gives cassi's model).

The frame is the smallest the authors' code runs at: square (it crops its result to as many columns as the frame
has rows) and at least 9 pixels (its single mirror reflection to a multiple of 16 needs a pad narrower than the
frame): 9×9, a 9×63 canvas padded to 16×64. The weights (0.78 M parameters, 3 MB) are stored as their seed with a
sha256 of their bytes in the authors' key order; stored in full: the scene, mask and measurement, the 1-stage
output, the 2-stage output (its γ and the roll forward between stages), the authors' state-dict keys of the
1- and 2-stage models and the parameter counts of the six published configurations.
"""
from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import zoo_common as zc  # noqa: E402

from cassi import CASSI  # noqa: E402
from cassi.models.zoo import compare, toolbox  # noqa: E402
from cassi.models.zoo.saunet import DROP_RATES, authors_key  # noqa: E402

SEEDS = {"scene_seed": 1, "mask_seed": 2, "weight_seed": 0}


def seeded(stages: int, seed: int = 0):
    """cassi's model of ``saunet_{stages}stg`` with the toolbox.seeded_state weights of ``seed``, in eval mode."""
    model = toolbox.build(f"saunet_{stages}stg")
    model.load_state_dict(toolbox.seeded_state(model, seed))
    return model.eval()


def checksum(state: dict, keys: list[str]) -> str:
    """sha256 of the float32 bytes of ``state`` (cassi's names) in the order of the authors' ``keys``."""
    h = hashlib.sha256()
    for k in keys:
        h.update(state[authors_key(k)].detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


def authors_measurement(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The authors' own measurement (``init_meas(gt, mask3d, "Y")``: Σ_c shift(mask·x)_c, step 2), (B, H, W+Δ)."""
    b, c, h, w = x.shape
    out = torch.zeros(b, c, h, w + 2 * (c - 1))
    for i in range(c):
        out[:, i, :, 2 * i:2 * i + w] = (mask * x)[:, i]
    return out.sum(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path)
    p.add_argument("--size", type=int, default=9, help="the square frame's side (at least 9)")
    args = p.parse_args()
    torch.set_num_threads(1)  # as the tests run
    authors = compare.load_authors("saunet", args.source)
    c, h = 28, args.size  # the authors' SAUNet fixes 28 bands and step 2, and crops to a square frame
    x, m = zc.scene((c, h, h), SEEDS["scene_seed"]), zc.mask((h, h), SEEDS["mask_seed"])
    op = CASSI(m, bands=c, step=2, backend="loop")  # one fixed backend: y is the same bits every run
    y = op(x)
    meas, inp = compare.authors_inputs("saunet", op, m, y)
    ref = {"method": "saunet", "shape": [c, h, h], **SEEDS, "scene": x[0].clone(), "mask": m.clone(),
           "y": y[0].clone()}
    for k in (1, 2):
        net = authors.model_generator(f"saunet_{k}stg")
        rates = {"drop": net.denoisers[0].encoder_layers[0][0].blocks[0].drop_path,
                 "mid": net.denoisers[0].bottleneck.blocks[-1].drop_path}
        got = [getattr(r, "drop_prob", getattr(r, "p", 0.0)) for r in rates.values()]
        assert all(abs(a - b) < 1e-6 for a, b in zip(got, DROP_RATES[k])), (got, DROP_RATES[k])
        ours = seeded(k, SEEDS["weight_seed"])
        state = ours.state_dict()
        keys = list(net.state_dict())
        assert sorted(authors_key(kk) for kk in keys) == sorted(state), "the key mapping is not one-to-one"
        net.load_state_dict({kk: state[authors_key(kk)] for kk in keys}, strict=True)
        with torch.no_grad():
            out = net.eval()(meas, inp)
            mine = ours(op, y)
            double = seeded(k, SEEDS["weight_seed"]).double()(CASSI(m.double(), bands=c, step=2), y.double())
        ref[f"output_{k}stg"] = out[0].clone()
        ref[f"authors_keys_{k}stg"] = keys
        ref[f"sha256_{k}stg"] = checksum(state, keys)
        peak = out.abs().max().item()
        for label, o in (("cassi float32", mine), ("cassi float64", double)):
            err = (o.double() - out.double()).abs().max().item()
            print(f"saunet_{k}stg {label}: max |diff| {err:.3g} = {err / peak:.3g} of the peak {peak:.4g}")
    ref["peak"] = float(ref["output_1stg"].abs().max())
    ref["params"] = {str(k): sum(p.numel() for p in authors.model_generator(f"saunet_{k}stg").parameters())
                     for k in DROP_RATES}
    own = authors_measurement(x, m)
    print(f"the authors' measurement against cassi's: max |diff| {(own - y[:, 0]).abs().max().item():.3g}")
    path = zc.REF_DIR / "saunet_1stg.pt"
    zc.REF_DIR.mkdir(parents=True, exist_ok=True)
    torch.save(ref, path)
    print(f"{path.name}: {path.stat().st_size / 1e3:.1f} kB; authors' params {ref['params']}")


if __name__ == "__main__":
    main()
