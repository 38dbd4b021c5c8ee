"""Evaluate a reconstructor on ground-truth scenes: simulate measurements, reconstruct, score.

    python scripts/evaluate.py                                  # GAP-TV on synthetic scenes
    python scripts/evaluate.py data=shared_cave solver=admm_tv  # shared CAVE crops, 256² TSA mask
    python scripts/evaluate.py -m solver=gap_tv,admm_tv,twist,pinv
Writes results.{md,csv,json} (per scene: PSNR, table PSNR, SSIM, SAM, time, iterations; plus mean).
"""
from pathlib import Path

import hydra
import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig
from rich.console import Console
from rich.markdown import Markdown

from cassi.lightning.module import ReconstructionModule, write_table


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> dict:
    L.seed_everything(cfg.seed, workers=True)
    module = ReconstructionModule(instantiate(cfg.solver), instantiate(cfg.operator, _partial_=True))
    trainer = instantiate(cfg.trainer)
    trainer.test(module, datamodule=instantiate(cfg.data))
    if not trainer.is_global_zero:
        return {}
    title = f"{cfg.solver._target_.rsplit('.', 1)[-1]} on {cfg.data_name}"
    paths = write_table(module.rows, Path(cfg.paths.output_dir) / "results", title)
    console = Console()
    console.print(Markdown(paths[0].read_text()))
    console.print(f"wrote {', '.join(str(p) for p in paths)}")
    return {k: v for k, v in module.rows[0].items()} if len(module.rows) == 1 else {}


if __name__ == "__main__":
    main()
