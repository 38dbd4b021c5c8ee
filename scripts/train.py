"""Train a learned reconstructor (conf/train.yaml): fit with the checkpoint chosen on validation, then
test the best checkpoint on the held-out test split.

    python scripts/train.py experiment=tiny_cpu          # GAP-TV + a learned correction on CAVE scenes, ~15 min on a CPU
    python scripts/train.py model=dauhst_3stg logger=tensorboard
    python scripts/train.py ckpt_path=outputs/<run>/checkpoints/last.ckpt     # resume
Returns (for sweeps) the best validation value of ``monitor``. Writes checkpoints/{best-*,last}.ckpt,
logs, test_results.{md,csv,json} and Hydra's composed config (.hydra/config.yaml) in the run folder.
The work is :func:`cassi.workflows.train.train`.
"""
import hydra
from omegaconf import DictConfig

from cassi.workflows.train import train


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    return train(cfg)


if __name__ == "__main__":
    main()
