"""Evaluate a reconstructor on ground-truth scenes (scripts/evaluate.py): simulate the measurements, reconstruct, and
score every scene (PSNR, the published tables' PSNR and SSIM, SSIM, SAM, time, iterations) into
``results.{md,csv,json}``; a converted published model is set beside what its authors report."""
from __future__ import annotations

import json
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig
from rich.console import Console

import cassi.threads
from cassi.lightning import seed_everything
from cassi.lightning.callbacks import ResultsTable
from cassi.lightning.module import ReconstructionModule
from cassi.models import load_model
from cassi.models.zoo.toolbox import reported_beside

__all__ = ["evaluate"]


def evaluate(cfg: DictConfig) -> Path:
    """Score ``cfg.ckpt`` (a checkpoint or ``pretrained/<name>``), else ``cfg.solver``, on ``cfg.data``'s test split
    through ``cfg.operator``; returns the stem of the results files (``<output_dir>/results``)."""
    cassi.threads.configure(cfg.threads)
    seed_everything(cfg.seed, workers=True)
    operator = instantiate(cfg.operator)
    reconstructor = load_model(cfg.ckpt, operator=operator) if cfg.ckpt else instantiate(cfg.solver)
    module = ReconstructionModule(reconstructor, operator)
    title = f"{cfg.ckpt or cfg.solver._target_.rsplit('.', 1)[-1]} on {cfg.data_name}"
    stem = Path(cfg.paths.output_dir) / "results"
    table = ResultsTable(stem, title)
    trainer = instantiate(cfg.trainer, callbacks=[*instantiate(cfg.trainer.callbacks), table])
    trainer.test(module, datamodule=instantiate(cfg.data))
    if trainer.is_global_zero:  # with ddp_spawn the table was written by the spawned rank 0
        results = json.loads(stem.with_suffix(".json").read_text())
        console = Console()
        console.print(ResultsTable.terminal_table(results["scenes"], title))  # the columns a person reads
        mean, method = results["mean"], (getattr(reconstructor, "converted", None) or {}).get("method")
        line = reported_beside(method, mean["psnr_table"], mean["ssim_table"],
                               f"{cfg.data_name}, {len(results['scenes'])} scenes")
        if line:
            console.print(line)
            with open(stem.with_suffix(".md"), "a") as f:
                f.write(f"\n{line}\n")
        console.print(f"wrote {stem}.md, .csv and .json (every column)")
    return stem
