"""One training step of fit_camera's three U-Nets (cave_any's stages: depth 4, 2C + 1 = 57 inputs, C = 28; windows
of 64², L1 loss, AdamW) at widths 16, 32 and 48, timed in turn in one process on the device given (cuda where
torch sees one, else the CPU), with each step's floating-point work counted by ``torch.utils.flop_counter`` (on the
meta device): what the widths of conf/machine/gpu.yaml and cpu_bf16.yaml rest on. Run it alone on the machine.

    python benchmarks/width_step.py [batch] [steps]      # batch: 32 on a GPU (gpu.yaml), 8 on the CPU

A width whose step computes a small share of what the device can is free there wherever something else (the data
loader) sets the pace: on one H100 fit_camera made about 13 steps a second for two width-16 U-Nets at batch 32
(docs/camera.md), 66 GFLOP a step by this count: 0.9 TFLOP/s.
"""
import sys
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from bf16_step import step  # each U-Net corrects the last one's output, as the stages of a Refiner
from cassi.models.refine import Refiner

WIDTHS = (16, 32, 48)


def gflop(width: int, batch: int) -> float:
    """Forward and backward of the three U-Nets on ``batch`` windows, counted on the meta device (no compute)."""
    nets = Refiner(bands=28, stages=3, width=width, mask_input=True).priors.to("meta")
    x = torch.zeros(batch, 57, 64, 64, device="meta")
    with FlopCounterMode(display=False) as count:
        step(nets, torch.optim.SGD(nets.parameters(), 0.0), x)
    return count.get_total_flops() / 1e9


def main(batch: int | None = None, steps: int = 30) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch = batch or (32 if device == "cuda" else 8)
    print(f"device {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, batch {batch} windows of 64², "
          f"{steps} steps each, torch {torch.__version__}", flush=True)
    torch.manual_seed(0)
    x = torch.rand(batch, 57, 64, 64, device=device)
    for width in WIDTHS:
        nets = Refiner(bands=28, stages=3, width=width, mask_input=True).priors.to(device)
        opt = torch.optim.AdamW(nets.parameters(), 1e-3)
        for _ in range(3):  # warm-up (cuDNN's algorithm search, the allocator)
            step(nets, opt, x)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step(nets, opt, x)
        if device == "cuda":
            torch.cuda.synchronize()
        s = (time.perf_counter() - t0) / steps
        work = gflop(width, batch)
        print(f"width {width}: {1000 * s:.1f} ms a step ({1 / s:.1f} steps/s), {work:.1f} GFLOP a step, "
              f"{work / s / 1000:.2f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
