"""One training step of a Refiner stage (tiny_cpu's: 8 windows of 96², 2C = 56 inputs, C = 28, L1 loss, Adam) with
each stage network, timed in turn in one process, one thread, median of the rounds after the first: the ratio that
sets the steps of the equal-CPU-time comparisons of docs/training.md ("Stage networks at equal CPU time"). Run it
alone on the machine.

    python benchmarks/prior_step.py [rounds]
"""
import statistics
import sys
import time

import torch

from cassi.models import Refiner

NETS = {"unet, width 16, depth 4": ("unet", 16, 4), "unet, width 16, depth 5": ("unet", 16, 5),
        "mst, width 28, depth 3": ("mst", 28, 3), "hst, width 28, depth 3": ("hst", 28, 3)}


def main(rounds: int = 6) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    models = {k: Refiner(28, 1, w, d, prior=p) for k, (p, w, d) in NETS.items()}
    opts = {k: torch.optim.Adam(m.parameters(), 1e-4) for k, m in models.items()}
    x, r, gt = torch.rand(8, 28, 96, 96), 0.05 * torch.randn(8, 28, 96, 96), torch.rand(8, 28, 96, 96)
    times = {k: [] for k in models}
    for _ in range(rounds):
        for k, m in models.items():
            t = time.perf_counter()
            loss = (m.refine(x, r) - gt).abs().mean()
            opts[k].zero_grad()
            loss.backward()
            opts[k].step()
            times[k].append(time.perf_counter() - t)
    for k, m in models.items():
        params = sum(p.numel() for p in m.priors.parameters()) / 1e6
        print(f"{k}: {params:.2f} M parameters, {statistics.median(times[k][1:]):.3f} s a step")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
