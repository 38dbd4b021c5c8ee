"""Make tests/data/zoo/<method>.pt by running the MST toolbox's own code on CPU (a developer's tool, not a test).

    PYTHONPATH=<einops install> .venv/bin/python tests/make_zoo_reference.py <toolbox train_code dir> METHOD [H W]

<toolbox train_code dir> is ``simulation/train_code`` of a checkout of caiyuanhao1998/MST (not shipped with
cassi). The toolbox model gets the seeded weights of the cassi model of the same method (mapped through the
method's key renaming: cassi.models.zoo.compare), its inputs are built as its ``template.py``/``utils.py``
build them, and its output is summarised by tests/zoo_common.summary.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import zoo_common as zc  # noqa: E402

from cassi.models.zoo import compare, toolbox  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("train_code", type=Path)
    p.add_argument("method")
    p.add_argument("size", nargs="*", type=int, default=[256, 256])
    p.add_argument("--weight-seed", type=int, default=0)
    args = p.parse_args()
    tb = compare.load_toolbox(args.train_code)
    h, w = args.size
    c = toolbox.METHODS[args.method].bands
    seeds = {"scene_seed": 1, "mask_seed": 2, "positions_seed": 3, "weight_seed": args.weight_seed}
    x, m = zc.scene((c, h, w), seeds["scene_seed"]), zc.mask((h, w), seeds["mask_seed"])
    net, keys = compare.toolbox_model(tb, args.method, seed=args.weight_seed)
    meas, inp_mask, targs = compare.toolbox_inputs(tb, args.method, x, m)
    torch.manual_seed(0)
    with torch.no_grad():
        out = net.eval()(meas, inp_mask)
    out = out[0] if isinstance(out, (tuple, list)) else out
    ref = {"method": args.method, "shape": [c, h, w], **seeds, **zc.summary(out, seeds["positions_seed"]),
           "toolbox_keys": keys, "input_setting": targs.input_setting, "input_mask": str(targs.input_mask)}
    zc.REF_DIR.mkdir(parents=True, exist_ok=True)
    torch.save(ref, zc.REF_DIR / f"{args.method}.pt")
    print(f"{args.method}: output {tuple(out.shape)}, peak {ref['peak']:.4g}, "
          f"{(zc.REF_DIR / f'{args.method}.pt').stat().st_size / 1e3:.1f} kB")


if __name__ == "__main__":
    main()
