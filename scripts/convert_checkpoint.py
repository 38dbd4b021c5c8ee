"""Convert a published model's weights into a cassi checkpoint.

    python scripts/convert_checkpoint.py source=mst method=mst_s weights=mst_s.pth out=mst_s.ckpt
    python scripts/convert_checkpoint.py source=dpu method=dpu_9stg weights=model_9stg.pkl out=dpu_9stg.ckpt
    python scripts/convert_checkpoint.py source=ssr method=ssr_l weights=model_L.pkl out=ssr_l.ckpt

The result loads with ``cassi.models.load_model(out)`` and ``ckpt=<out>`` in every script
(conf/convert_checkpoint.yaml lists the methods; cassi.models.zoo holds the architectures).
"""
import sys

import hydra
from omegaconf import DictConfig

from cassi.models.zoo import METHODS, convert

SOURCES = ("mst", "dpu", "ssr", "saunet")


@hydra.main(version_base="1.3", config_path="../conf", config_name="convert_checkpoint")
def main(cfg: DictConfig) -> None:
    if cfg.source not in SOURCES:
        sys.exit(f"error: source={cfg.source!r} is not known; known: {', '.join(SOURCES)}")
    if cfg.method in METHODS and METHODS[cfg.method].source != cfg.source:
        sys.exit(f"error: method={cfg.method} comes from source={METHODS[cfg.method].source}, not {cfg.source}")
    try:
        out = convert(cfg.method, cfg.weights, cfg.out, wavelengths=cfg.wavelengths)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(f"wrote {out} ({cfg.source} {cfg.method}); load it with ckpt={out}")


if __name__ == "__main__":
    main()
