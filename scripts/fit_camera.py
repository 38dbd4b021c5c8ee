"""Fit a learned model to a camera in one command (conf/fit_camera.yaml, cassi.workflows.fit).

    python scripts/fit_camera.py camera=tsa_real budget_hours=3 output_dir=runs/fit_tsa_real
    python scripts/fit_camera.py camera.mask=mask.mat camera.noise.photons=3000 budget_hours=0.5 output_dir=runs/cam
    python scripts/fit_camera.py camera=tsa_simulation machine=gpu budget_hours=0.15 output_dir=runs/cave_tsa_gpu
    python scripts/fit_camera.py camera=tsa_real init=dpu_5stg.ckpt budget_hours=1 output_dir=runs/dpu_real

``machine=auto`` (the default) is ``machine=gpu`` where torch sees a CUDA GPU, else ``machine=cpu_bf16`` on a CPU
that computes bfloat16 in hardware (``cassi.workflows.fit.native_bf16``), else ``machine=cpu``.
Writes output_dir/model.ckpt (load with ckpt=...) and output_dir/card.md; run it again to continue after a stop.
The work is :func:`cassi.workflows.fit.fit_from_config`.
"""
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from cassi.workflows.fit import fit_from_config


@hydra.main(version_base="1.3", config_path="../conf", config_name="fit_camera")
def main(cfg: DictConfig) -> None:
    try:  # a bad camera, init or budget fails in one line, before any work
        fit_from_config(cfg, HydraConfig.get().runtime.choices.get("machine"))
    except (RuntimeError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
