"""Evaluate a reconstructor on ground-truth scenes: simulate measurements, reconstruct, score.

    python scripts/evaluate.py                                  # GAP-TV on synthetic scenes
    python scripts/evaluate.py data=shared_cave solver=admm_tv  # shared CAVE crops, 256² TSA mask
    python scripts/evaluate.py -m solver=gap_tv,admm_tv,twist,pinv
    python scripts/evaluate.py data=shared_cave ckpt=outputs/<run>/checkpoints/last.ckpt   # a trained model
Writes results.{md,csv,json} (per scene: PSNR, table PSNR, SSIM, SAM, time, iterations; plus mean).
"""
import json
from pathlib import Path

import hydra
import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig
from rich.console import Console

import cassi.threads
from cassi.lightning.callbacks import ResultsTable
from cassi.lightning.module import ReconstructionModule
from cassi.models import load_model


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    cassi.threads.configure(cfg.threads)
    L.seed_everything(cfg.seed, workers=True)
    operator = instantiate(cfg.operator, _partial_=True)
    reconstructor = load_model(cfg.ckpt, operator=operator) if cfg.ckpt else instantiate(cfg.solver)
    module = ReconstructionModule(reconstructor, operator)
    title = f"{cfg.ckpt or cfg.solver._target_.rsplit('.', 1)[-1]} on {cfg.data_name}"
    table = ResultsTable(Path(cfg.paths.output_dir) / "results", title)
    trainer = instantiate(cfg.trainer, callbacks=[*instantiate(cfg.trainer.callbacks), table])
    trainer.test(module, datamodule=instantiate(cfg.data))
    if trainer.is_global_zero:  # with ddp_spawn the table was written by the spawned rank 0
        stem = Path(cfg.paths.output_dir) / "results"
        rows = json.loads(stem.with_suffix(".json").read_text())["scenes"]
        Console().print(ResultsTable.terminal_table(rows, title))  # the columns a person reads
        Console().print(f"wrote {stem}.md, .csv and .json (every column)")


if __name__ == "__main__":
    main()
