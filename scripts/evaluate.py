"""Evaluate a reconstructor on ground-truth scenes: simulate measurements, reconstruct, score.

    python scripts/evaluate.py                                  # GAP-TV on synthetic scenes
    python scripts/evaluate.py data=shared_cave solver=admm_tv  # shared CAVE crops, 256² TSA mask
    python scripts/evaluate.py -m solver=gap_tv,admm_tv,twist,pinv
    python scripts/evaluate.py data=shared_cave ckpt=outputs/<run>/checkpoints/last.ckpt   # a trained model
    python scripts/evaluate.py data=cave_kaist ckpt=mst_s.ckpt  # a published model in its paper's protocol
Writes results.{md,csv,json} (per scene: PSNR, the published tables' PSNR and SSIM, SSIM, SAM, time, iterations;
plus mean). The work is :func:`cassi.workflows.evaluate.evaluate`.
"""
import hydra
from omegaconf import DictConfig

from cassi.workflows.evaluate import evaluate


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    evaluate(cfg)


if __name__ == "__main__":
    main()
