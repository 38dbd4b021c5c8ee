"""Make tests/data/zoo/ssr_<cfg>.pt by running the SSR authors' own code on CPU (a developer's tool, not a test).

    PYTHONPATH=<einops install> .venv/bin/python tests/make_ssr_reference.py <SSR checkout or its git dir> \
        [--method ssr_s] [--size 40 64]

<SSR checkout> is a clone of GitHub ZhangJC-2k/SSR (MIT licence; not shipped with cassi), or a bare git directory of
it (its ``Model.py`` is read from HEAD). Its ``.cuda()`` calls become no-ops in this process. The authors' ``Net``
of the method's stage count gets the seeded weights of cassi's :class:`~cassi.models.zoo.ssr.SSR`
(``toolbox.seeded_state``, mapped through :func:`~cassi.models.zoo.ssr.authors_key`), and the inputs its
``Dataset.py`` gives it (the measurement, the mask per band, Σ_c of the placed mask squared with zeros set to 1),
on the scene and mask of tests/zoo_common.py, with the measurement computed by cassi's operator (``op(x)``, its
``loop`` backend: the y that the test gives cassi's model).

The weights are seeded (:func:`seeded`). The default frame, 40×64, is one the authors' code runs at with its
padding at work: 40 rows are mirror-padded to 48, whose bottleneck side (12) its windowing splits into one 12-row
window (8-pixel windows elsewhere).

Stored (no weights: one stage holds 0.6 M parameters, 2.4 MB; the test regenerates them from the seed, and the
file holds their sha256 to show that it did): the inputs (y, the mask), the authors' last output in full and
its summary (tests/zoo_common.summary), the band means of its first stage's output, the keys of one stage of its
state dict (to rebuild a published-layout checkpoint of any stage count: :func:`authors_keys`), and the
parameter counts of its S, M and L models. Also printed: cassi's output against it (float32, and float64).
"""
from __future__ import annotations

import argparse
import re
import sys
import types
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import zoo_common as zc  # noqa: E402

from cassi import CASSI  # noqa: E402
from cassi.models.zoo import compare, toolbox  # noqa: E402
from cassi.models.zoo.ssr import SSR, authors_key  # noqa: E402

SEEDS = {"scene_seed": 1, "mask_seed": 2, "positions_seed": 3, "weight_seed": 0}
STAGES = {"ssr_s": 3, "ssr_m": 6, "ssr_l": 9}


def seeded(stages: int = 3, seed: int = 0, bands: int = 28) -> SSR:
    """cassi's SSR of ``stages`` stages with the toolbox.seeded_state weights of ``seed``, every LayerNorm and
    GroupNorm scale plus 1 (near 1, as the authors initialise them), in eval mode. With seeded_state's plain
    scales (±0.17) the normalised features are so small that q·k is too, the channel softmax is nearly uniform, and
    swapping q and k moved the output by only 7.6e-5 of its peak: the attention would barely be tested. With the
    scales near 1 that swap moves it by 4e-2."""
    model = SSR(bands=bands, stages=stages)
    state = toolbox.seeded_state(model, seed)
    for name, m in model.named_modules():
        if isinstance(m, (nn.LayerNorm, nn.GroupNorm)):
            state[f"{name}.weight"] = state[f"{name}.weight"] + 1
    model.load_state_dict(state)
    return model.eval()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", type=Path)
    p.add_argument("--method", choices=sorted(STAGES), default="ssr_s")
    p.add_argument("--size", nargs=2, type=int, default=[40, 64])
    args = p.parse_args()
    torch.set_num_threads(1)  # as the tests run
    authors = compare.load_authors("ssr", args.source)
    stages = STAGES[args.method]
    c, (h, w) = 28, args.size  # the authors' Net fixes 28 bands and step 2
    x, m = zc.scene((c, h, w), SEEDS["scene_seed"]), zc.mask((h, w), SEEDS["mask_seed"])
    op = CASSI(m, bands=c, step=2, backend="loop")  # one fixed backend: y is the same bits every run
    y = op(x)
    ours = seeded(stages, SEEDS["weight_seed"])
    state = ours.state_dict()
    net = authors.Net(types.SimpleNamespace(stage=stages, bands=c, size=w))  # size: the width it crops to
    keys = list(net.state_dict())
    assert sorted(authors_key(k) for k in keys) == sorted(state), "the key mapping is not one-to-one"
    net.load_state_dict({k: state[authors_key(k)] for k in keys}, strict=True)
    g, inp = compare.authors_inputs("ssr", op, m, y)
    with torch.no_grad():
        outs = net.eval()(g.clone(), input_mask=inp)
    params = {s: sum(p.numel() for p in authors.Net(types.SimpleNamespace(stage=k, bands=c, size=256)).parameters())
              for s, k in STAGES.items()}
    pattern = [k for k in keys if re.match(r"(initial|rhos\.0|net_stage\.[01])\.", k)]
    assert sorted(zc.stage_keys(pattern, stages, "rhos", 2)) == sorted(keys)
    ref = {"method": args.method, "stages": stages, "shape": [c, h, w], **SEEDS, "weights_sha256": zc.digest(state),
           "y": y.clone(), "mask": m.clone(), "out": outs[-1][0].clone(),
           **zc.summary(outs[-1], SEEDS["positions_seed"]),
           "first_band_mean": zc.summary(outs[0], SEEDS["positions_seed"])["band_mean"],
           "authors_keys": pattern, "params": params}
    name = f"{args.method}_{h}x{w}" if [h, w] != [40, 64] else args.method
    zc.REF_DIR.mkdir(parents=True, exist_ok=True)
    torch.save(ref, zc.REF_DIR / f"{name}.pt")
    print(f"{name}: output {tuple(outs[-1].shape)}, peak {ref['peak']:.4g}, authors' params {params}, "
          f"{(zc.REF_DIR / f'{name}.pt').stat().st_size / 1e3:.1f} kB")
    with torch.no_grad():
        mine = ours(op, y, return_stages=True)
        double = seeded(stages, SEEDS["weight_seed"]).double()(CASSI(m.double(), bands=c, step=2), y.double())
    for label, o in (("cassi float32", mine[-1]), ("cassi float64", double)):
        err = (o.double() - outs[-1].double()).abs().max().item()
        print(f"{label}: max |diff| {err:.3g} = {err / ref['peak']:.3g} of the peak"
              f"{' (bit for bit)' if err == 0 else ''}")
    err = max((a - b).abs().max().item() for a, b in zip(mine, outs))
    print(f"every stage, float32: max |diff| {err:.3g}")


if __name__ == "__main__":
    main()
