"""Reconstruct measurements (scripts/reconstruct.py, the main job): a solver or a trained model (beside a solver) over
``cfg.data``'s predict split, each scene written as it comes (cube, previews, its record), then the summary and report
page; complete scenes of an earlier run into the same folder are kept."""
from __future__ import annotations

from hydra.utils import instantiate
from omegaconf import DictConfig
from rich.console import Console

import cassi.threads
from cassi.lightning import seed_everything
from cassi.lightning.module import ReconstructionModule
from cassi.models import load_model

__all__ = ["EXIT_FAILED_INPUTS", "reconstruct"]

EXIT_FAILED_INPUTS = 3  # the exit status of a run in which some inputs failed (the others are written)


def reconstruct(cfg: DictConfig, console: Console | None = None) -> int:
    """Run the job of conf/reconstruct.yaml; returns 0 when every input was reconstructed, else
    :data:`EXIT_FAILED_INPUTS` (one line per failed input printed at the end)."""
    cassi.threads.configure(cfg.threads)
    seed_everything(cfg.seed, workers=True)
    console = console or Console()
    writer = instantiate(cfg.writer)
    datamodule = instantiate(cfg.data)
    operator = instantiate(cfg.operator)
    # a checkpoint's band count and dispersion are checked against the configured operator here, before any work
    reconstructor = load_model(cfg.ckpt, operator=operator) if cfg.ckpt else instantiate(cfg.solver)
    # with a trained model, the configured solver (GAP-TV by default) runs beside it (~solver: not)
    baseline = instantiate(cfg.solver) if cfg.ckpt and cfg.get("solver") else None
    if cfg.tile:
        reconstructor = instantiate(cfg.tile, reconstructor)
        baseline = instantiate(cfg.tile, baseline) if baseline is not None else None
    module = ReconstructionModule(reconstructor, operator, skip=writer.complete, baseline=baseline)
    trainer = instantiate(cfg.trainer, callbacks=[*instantiate(cfg.trainer.callbacks), writer])
    trainer.predict(module, datamodule=datamodule, return_predictions=False)
    if not trainer.is_global_zero:
        return 0
    console.print(writer.terminal_table())  # the columns a person reads; every column is in summary.{md,csv,json}
    kept = sum(r.get("status") == "complete: kept" for r in writer.rows)
    written = sum(r.get("status") != "failed" for r in writer.rows)  # a scene whose baseline failed is written
    console.print(f"{written} scene(s) in {writer.output_dir} ({kept} complete from "
                  f"an earlier run, kept); report: {writer.output_dir / 'index.html'}")
    if not writer.failed:
        return 0
    console.print(f"[red]{len(writer.failed)} input(s) failed:[/red]")
    for name, reason in writer.failed:
        console.print(f"FAILED {name}: {reason}", markup=False, highlight=False, soft_wrap=True)
    return EXIT_FAILED_INPUTS
