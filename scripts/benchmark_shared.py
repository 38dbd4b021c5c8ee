"""Speed on a shared machine: GAP-TV and a shipped model quiet and beside busy processes under each thread
setting, and a local two-job sweep against its jobs one after the other (cassi.bench_shared; conf/benchmark_shared.yaml).

    python scripts/benchmark_shared.py mask=../shared/data/masks/tsa_simu_mask_256.mat
Writes contention.{md,json} and sweep.{md,json} into the Hydra output folder. Run it on an otherwise quiet machine.
"""
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from cassi import bench_shared

ROOT = Path(__file__).resolve().parents[1]


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark_shared")
def main(cfg: DictConfig) -> None:
    out = Path(cfg.output_dir)
    spec = {k: cfg[k] for k in ("size", "bands", "iters", "repeats", "mask", "ckpt")}
    if cfg.rounds:  # rounds=0: the sweep alone
        rows = bench_shared.contention(spec, tuple(cfg.busy), tuple(cfg.settings), cfg.rounds)
        md = bench_shared.contention_markdown(rows, cfg.ckpt and Path(cfg.ckpt).name) + "\n" + bench_shared.NOTE
        bench_shared.save(out, "contention", {"spec": spec, "rows": rows}, md + "\n")
        print(md)
    if cfg.sweep:
        launchers = OmegaConf.to_container(cfg.sweep.launchers, resolve=True)
        command = [sys.executable, *cfg.sweep.command]
        sweep_rows = bench_shared.sweep(command, launchers, ROOT, out / "sweeps")
        smd = bench_shared.sweep_markdown(sweep_rows, cfg.sweep.jobs, " ".join(cfg.sweep.command))
        bench_shared.save(out, "sweep", sweep_rows, smd)
        print(smd)
    print(f"wrote {', '.join(str(out / n) for n, on in (('contention.md', cfg.rounds), ('sweep.md', cfg.sweep)) if on)}")


if __name__ == "__main__":
    main()
