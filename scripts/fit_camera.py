"""Fit a learned model to a camera in one command (conf/fit_camera.yaml, cassi.workflows.fit).

    python scripts/fit_camera.py camera=tsa_real budget_hours=3 output_dir=runs/fit_tsa_real
    python scripts/fit_camera.py camera.mask=mask.mat camera.noise.photons=3000 budget_hours=0.5 output_dir=runs/cam
    python scripts/fit_camera.py camera=tsa_simulation machine=gpu budget_hours=0.15 output_dir=runs/cave_tsa_gpu
    python scripts/fit_camera.py camera=tsa_real init=dpu_5stg.ckpt budget_hours=1 output_dir=runs/dpu_real

``machine=auto`` (the default) is ``machine=gpu`` where torch sees a CUDA GPU, else ``machine=cpu_bf16`` on a CPU
that computes bfloat16 in hardware (``cassi.workflows.fit.native_bf16``), else ``machine=cpu``.
Writes output_dir/model.ckpt (load with ckpt=...) and output_dir/card.md; run it again to continue after a stop.
"""
import sys

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from cassi.workflows.fit import Machine, fit_camera, native_bf16, scene_side
from cassi.physics.camera import Camera
import cassi.threads


@hydra.main(version_base="1.3", config_path="../conf", config_name="fit_camera")
def main(cfg: DictConfig) -> None:
    cassi.threads.configure(cfg.threads)
    camera = OmegaConf.to_container(cfg.camera, resolve=True)
    try:  # a bad camera spec fails here, in one line, before any work
        cam = Camera(**camera)
        cam.check()  # a missing file first
        scene = scene_side(cam)  # 256, or a smaller mask's side
        cam.check(frame=(scene, scene))
    except ValueError as e:
        sys.exit(f"error: {e}")
    task = HydraConfig.get().overrides.task
    camera_overrides = [o for o in task if o.lstrip("+~").startswith("camera")]
    noiseless = not any(v is not None for v in camera["noise"].values())
    machine = OmegaConf.to_container(cfg.machine, resolve=True)
    if HydraConfig.get().runtime.choices.get("machine") == "auto":  # the pick's values, where none was given
        pick = "gpu" if torch.cuda.is_available() else "cpu_bf16" if native_bf16() else "cpu"
        given = {k: v for k, v in machine.items() if v is not None}
        picked = hydra.compose(config_name=f"machine/{pick}").machine  # through Hydra's search path
        machine = {**OmegaConf.to_container(picked), **given}
        why = {"gpu": "CUDA", "cpu_bf16": "no CUDA GPU, a CPU with bfloat16", "cpu": "no CUDA GPU"}[pick]
        print(f"fit_camera: machine={pick} ({why} here; give machine=cpu, cpu_bf16 or gpu to choose)")
    machine = Machine(**machine)
    print(f"fit_camera: plan priced at {machine.scene_s:g} s a pool scene, two stages from {machine.two_stages_min:g} "
          f"min of training (from an init with two, a third from {machine.three_stages_min:g}); "
          f"the machine's train.py overrides: {' '.join(machine.train) or 'none'} (the recipe's and the init's width "
          f"follow: the U-Nets' width is in the next line)")
    try:
        fit_camera(cfg.output_dir, camera_overrides, machine, cfg.budget_hours, noiseless,
                   [f"threads={cfg.threads}", *cfg.recipe], cfg.pool,
                   init=cfg.init, scene=scene, bands=cam.bands)
    except (RuntimeError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
