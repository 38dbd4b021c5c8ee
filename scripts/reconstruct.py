"""Main job: simulate a synthetic scene, measure it with the CASSI operator and reconstruct it.

    python scripts/reconstruct.py                        # defaults (conf/reconstruct.yaml)
    python scripts/reconstruct.py operator.backend=loop scene.height=128
"""
import time

import hydra
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from rich.console import Console


@hydra.main(version_base="1.3", config_path="../conf", config_name="reconstruct")
def main(cfg: DictConfig) -> None:
    console = Console()
    torch.manual_seed(cfg.seed)
    x = instantiate(cfg.scene)[None]  # (1, C, H, W)
    op = instantiate(cfg.operator, mask=instantiate(cfg.mask))
    console.print(f"scene {tuple(x.shape)} in [{x.min():.2f}, {x.max():.2f}]; operator {op}")
    t0 = time.perf_counter()
    y = op(x)
    t1 = time.perf_counter()
    x0 = op.pinv(y)
    t2 = time.perf_counter()
    mse = torch.mean((x0.clamp(0, 1) - x) ** 2)
    psnr = 10 * torch.log10(1 / mse)
    res = (op(x0) - y).norm() / y.norm()
    console.print(f"measurement y = A x: {tuple(y.shape)} in {1e3 * (t1 - t0):.1f} ms")
    console.print(f"pseudo-inverse A⁺y: {tuple(x0.shape)} in {1e3 * (t2 - t1):.1f} ms, "
                  f"PSNR {psnr:.2f} dB, relative residual {res:.1e}")


if __name__ == "__main__":
    main()
