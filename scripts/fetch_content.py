"""Fetch the training content beyond CAVE (measured spectra, photographs) from its packages.

    python scripts/fetch_content.py
    python scripts/fetch_content.py sources=[earthlib,skimage] root=/data/cassi_content

conf/fetch_content.yaml lists the sources and their licences; cassi.data.sources does the work. Exit status 1
when a source could not be fetched (the others are fetched all the same).
"""
import sys

import hydra
from omegaconf import DictConfig

from cassi.data.sources import fetch


@hydra.main(version_base="1.3", config_path="../conf", config_name="fetch_content")
def main(cfg: DictConfig) -> None:
    try:
        fetch(None if cfg.sources is None else list(cfg.sources), root=cfg.root, force=cfg.force)
    except (RuntimeError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
