"""Main job: reconstruct CASSI measurements; write the cubes, pictures, a summary and a report page.

    python scripts/reconstruct.py                          # GAP-TV on generated scenes (no files needed)
    python scripts/reconstruct.py data=real solver=gap_tv_real   # the five real TSA scenes
    python scripts/reconstruct.py data=measurements data.predict.entries='meas/*.mat' data.predict.mask=mask.mat
    python scripts/reconstruct.py output_dir=runs/real data=real   # again: complete scenes are kept, the rest redone
    python scripts/reconstruct.py solver=admm_tv operator.backend=strided writer.fmt=h5 preview=false tile=null
    python scripts/reconstruct.py data=real ckpt=outputs/<run>/checkpoints/best-….ckpt   # a trained model,
                                                                # beside the solver (GAP-TV; ~solver: alone)
Writes, in the run folder, reconstructions/<name>.<fmt> (with wavelengths and geometry), previews/<name>*.png,
scenes/<name>.json, summary.{md,csv,json} and index.html. Exit status: 0 when every input was reconstructed,
3 when some failed (the others are written; one line per failed input at the end), 1 when the run itself failed.
"""
import sys

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig
from rich.console import Console

import cassi.threads
from cassi.lightning import seed_everything
from cassi.lightning.module import ReconstructionModule
from cassi.models import load_model

EXIT_FAILED_INPUTS = 3


@hydra.main(version_base="1.3", config_path="../conf", config_name="reconstruct")
def main(cfg: DictConfig) -> None:
    cassi.threads.configure(cfg.threads)
    seed_everything(cfg.seed, workers=True)
    console = Console()
    writer = instantiate(cfg.writer)
    datamodule = instantiate(cfg.data)
    operator = instantiate(cfg.operator, _partial_=True)
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
        return
    console.print(writer.terminal_table())  # the columns a person reads; every column is in summary.{md,csv,json}
    kept = sum(r.get("status") == "complete: kept" for r in writer.rows)
    written = sum(r.get("status") != "failed" for r in writer.rows)  # a scene whose baseline failed is written
    console.print(f"{written} scene(s) in {writer.output_dir} ({kept} complete from "
                  f"an earlier run, kept); report: {writer.output_dir / 'index.html'}")
    if writer.failed:
        console.print(f"[red]{len(writer.failed)} input(s) failed:[/red]")
        for name, reason in writer.failed:
            console.print(f"FAILED {name}: {reason}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(EXIT_FAILED_INPUTS)


if __name__ == "__main__":
    main()
