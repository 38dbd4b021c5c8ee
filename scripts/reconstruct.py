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
The work is :func:`cassi.workflows.reconstruct.reconstruct`.
"""
import sys

import hydra
from omegaconf import DictConfig

from cassi.workflows.reconstruct import reconstruct


@hydra.main(version_base="1.3", config_path="../conf", config_name="reconstruct")
def main(cfg: DictConfig) -> None:
    if status := reconstruct(cfg):  # (exit 0 would end a -m sweep after its first job)
        sys.exit(status)


if __name__ == "__main__":
    main()
