"""Train a learned reconstructor (conf/train.yaml, ``scripts/train.py``): fit with the checkpoint chosen on
validation, then test the best checkpoint on the held-out test split.

As a module, the job a fit starts in a fresh process (the same config, overrides as on the script's command line)::

    python -m cassi.workflows.train experiment=tiny_cpu trainer.max_steps=10
"""
from __future__ import annotations

from pathlib import Path

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

import cassi.threads
from cassi.lightning import seed_everything
from cassi.lightning.callbacks import ResultsTable
from cassi.lightning.training import best_score
from cassi.workflows import CONF

__all__ = ["train"]


def train(cfg: DictConfig) -> float | None:
    """Fit ``cfg.module`` (``cfg.model`` through ``cfg.operator``) on ``cfg.data``, resumed from ``cfg.ckpt_path``
    when given, then test the best checkpoint when ``cfg.test``; returns the best validation value of
    ``cfg.monitor`` (what a sweep optimises). Writes checkpoints/{best-*,last}.ckpt, logs and
    test_results.{md,csv,json} under ``cfg.paths.output_dir``."""
    cassi.threads.configure(cfg.threads)
    seed_everything(cfg.seed, workers=True)
    datamodule = instantiate(cfg.data)
    module = instantiate(cfg.module, model=instantiate(cfg.model), operator=instantiate(cfg.operator))
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


@hydra.main(version_base="1.3", config_path=CONF, config_name="train")
def main(cfg: DictConfig) -> float | None:
    return train(cfg)


if __name__ == "__main__":
    main()
