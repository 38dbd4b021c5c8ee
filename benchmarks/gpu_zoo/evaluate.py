"""Both trainers' final weights on the same validation crops, one evaluator (on the GPU machine):

    python benchmarks/gpu_zoo/evaluate.py <cassi last.ckpt> <toolbox final.pth> <method> <root> <out.json>

PSNR = 10·log10(1 / MSE) per crop (cubes in [0, 1]), SSIM (torchmetrics, data_range 1), means over the crops;
y = op(x) with op = CASSI(mask, bands=28, step=2), float32.
"""
import json
import sys
from pathlib import Path

import torch
from torchmetrics.functional.image import structural_similarity_index_measure as ssim

from cassi import CASSI
from cassi.io import load_cube, load_mask
from cassi.models import load_model
from cassi.models.zoo import toolbox


@torch.no_grad()
def score(model, op, cubes):
    psnr, ss = [], []
    for x in cubes:
        xh = model(op, op(x)).clamp(0, 1)
        psnr.append(float(10 * torch.log10(1 / torch.mean((xh - x) ** 2))))
        ss.append(float(ssim(xh, x, data_range=1.0)))
    return sum(psnr) / len(psnr), sum(ss) / len(ss)


def main(ckpt, pth, method, root, out):
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    kaist = Path(root) / "data" / "cave_kaist"
    op = CASSI(load_mask(kaist / "mask_256.mat"), bands=28, step=2).to(dev)
    cubes = [load_cube(p).data[None].to(dev) for p in sorted((kaist / "val").glob("*.mat"))]
    ours = load_model(ckpt).to(dev).eval()
    theirs = toolbox.load_toolbox_weights(toolbox.build(method), method, pth).to(dev).eval()
    res = {"crops": len(cubes)}
    for name, model in (("cassi", ours), ("toolbox", theirs)):
        res[name] = dict(zip(("psnr", "ssim"), score(model, op, cubes)))
    Path(out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


if __name__ == "__main__":
    main(*sys.argv[1:6])
