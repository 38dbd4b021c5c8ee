"""Train a learned reconstructor (conf/train.yaml): fit with the checkpoint chosen on validation, then
test the best checkpoint on the held-out test split.

    python scripts/train.py experiment=tiny_cpu          # GAP-TV + a learned correction on CAVE scenes, ~15 min on a CPU
    python scripts/train.py model=dauhst_3stg logger=tensorboard
    python scripts/train.py ckpt_path=outputs/<run>/checkpoints/last.ckpt     # resume
Returns (for sweeps) the best validation value of ``monitor``. Writes checkpoints/{best-*,last}.ckpt,
logs, test_results.{md,csv,json} and Hydra's composed config (.hydra/config.yaml) in the run folder.
"""
from pathlib import Path

import hydra
import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig

import cassi.threads
from cassi.lightning.callbacks import ResultsTable
from cassi.lightning.training import best_score


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    cassi.threads.configure(cfg.threads)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    module = instantiate(cfg.module, model=instantiate(cfg.model), operator=instantiate(cfg.operator, _partial_=True))
    results = ResultsTable(Path(cfg.paths.output_dir) / "test_results", f"{cfg.model._target_} (best on {cfg.monitor})")
    callbacks = [c for c in instantiate(cfg.callbacks).values() if c is not None]
    trainer = instantiate(cfg.trainer, callbacks=[*callbacks, results], logger=instantiate(cfg.logger))
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.ckpt_path)
    best = best_score(trainer.checkpoint_callback)
    value = best if best is not None else float(trainer.callback_metrics.get(cfg.monitor, float("nan")))
    if cfg.test and datamodule.datasets["test"] is not None:
        ckpt = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        trainer.test(module, datamodule=datamodule, ckpt_path=ckpt or None)
    if trainer.is_global_zero:
        print(f"best {cfg.monitor}: {value:.4f}" + (f" ({trainer.checkpoint_callback.best_model_path})"
                                                      if trainer.checkpoint_callback else ""))
    return value


if __name__ == "__main__":
    main()
