"""One training step of fit_camera's pair of U-Nets (cave_any's: width 16, depth 4, 2C + 1 = 57 inputs, C = 28;
8 windows of 96², L1 loss, AdamW), in float32 and under bfloat16 autocast (Lightning's ``precision=bf16-mixed``),
timed in turn in one process: what conf/machine/cpu_bf16.yaml rests on. Run it alone on the machine.

    python benchmarks/bf16_step.py [steps]

Measured on the 2-core development host (avx512_bf16, torch 2.13.0+cpu, 2026-11-28; 40 steps each):
float32 276 ms a step, bfloat16 172 ms (1.61×). torch.compile of the same U-Nets (inductor): 279 ms (no gain).
"""
import contextlib
import sys
import time

import torch

from cassi.workflows.fit import native_bf16
from cassi.models.blocks import UNet


def step(nets, opt, x: torch.Tensor) -> None:
    opt.zero_grad()
    out = x[:, :28]
    for net in nets:  # the second U-Net corrects the first's output, as in a Refiner of two stages
        out = net(torch.cat([out, x[:, 28:]], 1).contiguous(memory_format=torch.channels_last))
    out.float().abs().mean().backward()
    opt.step()


def main(steps: int = 40) -> None:
    torch.manual_seed(0)
    x = torch.rand(8, 57, 96, 96)
    ms = {}
    for name in ("float32", "bfloat16", "float32 again"):
        nets = [UNet(57, 28, 16, 4), UNet(57, 28, 16, 4)]
        opt = torch.optim.AdamW([p for n in nets for p in n.parameters()], 1e-3)
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if name == "bfloat16" else contextlib.nullcontext()
        with ctx:
            for _ in range(3):  # warm-up
                step(nets, opt, x)
            t0 = time.perf_counter()
            for _ in range(steps):
                step(nets, opt, x)
        ms[name] = 1000 * (time.perf_counter() - t0) / steps
        print(f"{name}: {ms[name]:.1f} ms a step", flush=True)
    print(f"bfloat16 against float32: {ms['float32'] / ms['bfloat16']:.2f}× "
          f"(float32 first and again: {ms['float32']:.1f}, {ms['float32 again']:.1f} ms); "
          f"bfloat16 in hardware here: {native_bf16()}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
