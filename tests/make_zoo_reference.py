"""Make tests/data/zoo/<method>.pt by running the MST toolbox's own code on CPU (a developer's tool, not a test).

    PYTHONPATH=<einops install> .venv/bin/python tests/make_zoo_reference.py <toolbox train_code dir> METHOD [H W]

<toolbox train_code dir> is ``simulation/train_code`` of a checkout of caiyuanhao1998/MST (not shipped with
cassi). The toolbox model gets the seeded weights of the cassi model of the same method (mapped through the
method's key renaming), its inputs are built as its ``template.py``/``utils.py`` build them (``.cuda()`` is a
no-op here), and its output is summarised by tests/zoo_common.summary.
"""
from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import zoo_common as zc  # noqa: E402

from cassi.models.zoo import toolbox  # noqa: E402


def _no_cuda() -> None:
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self


def toolbox_modules(train_code: Path):
    """The toolbox's ``architecture`` package, ``template.set_template`` and ``utils`` (shift, init_meas, ...)."""
    _no_cuda()
    sys.path.insert(0, str(train_code))
    sys.modules.setdefault("ssim_torch", types.SimpleNamespace(ssim=None))  # utils imports it; unused here
    import architecture  # noqa: PLC0415
    import template  # noqa: PLC0415
    import utils  # noqa: PLC0415
    return architecture, template, utils


def toolbox_inputs(utils, template, method: str, x: torch.Tensor, m: torch.Tensor):
    """(input_meas, input_mask) of ``method`` for scene x (1, C, H, W) and mask m (H, W), as train.py makes them."""
    args = types.SimpleNamespace(template=method, input_setting=None, input_mask=None, max_epoch=300)
    template.set_template(args)
    c = x.shape[1]
    mask3d = m[None, None].expand(1, c, *m.shape).float()
    meas = utils.init_meas(x, mask3d, args.input_setting)
    if args.input_mask == "Phi":
        inp_mask = utils.shift(mask3d)
    elif args.input_mask == "Phi_PhiPhiT":
        phi = utils.shift(mask3d)
        phi_s = torch.sum(phi ** 2, 1)
        phi_s[phi_s == 0] = 1
        inp_mask = (phi, phi_s)
    elif args.input_mask == "Mask":
        inp_mask = mask3d
    else:
        inp_mask = None
    return meas, inp_mask, args


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("train_code", type=Path)
    p.add_argument("method")
    p.add_argument("size", nargs="*", type=int, default=[256, 256])
    p.add_argument("--weight-seed", type=int, default=0)
    args = p.parse_args()
    architecture, template, utils = toolbox_modules(args.train_code)
    h, w = args.size
    c = toolbox.METHODS[args.method].bands
    seeds = {"scene_seed": 1, "mask_seed": 2, "positions_seed": 3, "weight_seed": args.weight_seed}
    x, m = zc.scene((c, h, w), seeds["scene_seed"]), zc.mask((h, w), seeds["mask_seed"])

    built = architecture.model_generator(args.method)
    net = built[0] if isinstance(built, tuple) else built
    ours = toolbox.build(args.method)
    seeded = toolbox.seeded_state(ours, args.weight_seed)
    rename = toolbox.METHODS[args.method].rename or (lambda k: k)
    keys = list(net.state_dict())
    net.load_state_dict({k: seeded[rename(k)] for k in keys}, strict=True)
    meas, inp_mask, targs = toolbox_inputs(utils, template, args.method, x, m)
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
