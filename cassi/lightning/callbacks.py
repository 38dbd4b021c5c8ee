"""Callbacks: write reconstructions to files as they are predicted."""
from __future__ import annotations

import logging
from pathlib import Path

import torch.distributed as dist
from lightning.pytorch.callbacks import BasePredictionWriter, Callback

from cassi.io import CAVE_WAVELENGTHS, TSA_WAVELENGTHS, save_cube
from cassi.lightning.module import write_table

NAMED_WAVELENGTHS = {"tsa": TSA_WAVELENGTHS, "cave": CAVE_WAVELENGTHS}

log = logging.getLogger("cassi")


class CubeWriter(BasePredictionWriter):
    """Saves every predicted cube as ``<output_dir>/<name>.<fmt>`` (atomic, with wavelengths and geometry).

    ``wavelengths``: nm per band, or 'tsa' / 'cave' for the standard sets. ``nonnegative``:
    clamp negative values (iterative estimates undershoot slightly at edges) to 0, as
    spectral radiance is ≥ 0 and ``cassi.io.load_cube`` rejects negative cubes. A sample that
    fails to save is logged and listed in ``failed``; the others are still written.
    """

    def __init__(self, output_dir: str, fmt: str = "tif", wavelengths=None, meta: dict | None = None,
                 overwrite: bool = False, nonnegative: bool = True):
        super().__init__(write_interval="batch")
        self.nonnegative = nonnegative
        self.output_dir, self.fmt = Path(output_dir), fmt.lstrip(".")
        wavelengths = NAMED_WAVELENGTHS.get(wavelengths, wavelengths) if isinstance(wavelengths, str) else wavelengths
        if isinstance(wavelengths, str):
            raise ValueError(f"wavelengths must be a list of nm or one of {sorted(NAMED_WAVELENGTHS)}, got {wavelengths!r}")
        self.wavelengths = None if wavelengths is None else [float(w) for w in wavelengths]
        self.meta = {k: v for k, v in dict(meta or {}).items() if v is not None}
        self.overwrite = overwrite
        self.written: list[Path] = []
        self.failed: list[tuple[str, str]] = []

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx=0):
        self.output_dir.mkdir(parents=True, exist_ok=True)
        x = prediction["x"].detach().float().cpu()
        if self.nonnegative:
            x = x.clamp_min(0)
        names = prediction.get("name") or [f"scene{batch_idx}_{i}" for i in range(x.shape[0])]
        for i, name in enumerate(names):
            path = self.output_dir / f"{name}.{self.fmt}"
            try:
                save_cube(path, x[i], wavelengths=self.wavelengths, meta=self.meta, overwrite=self.overwrite)
                self.written.append(path)
            except Exception as e:  # one bad sample must not lose the others
                log.error("could not write %s: %s", path, e)
                self.failed.append((name, f"{type(e).__name__}: {e}"))


class ResultsTable(Callback):
    """After testing, gathers the per-scene rows of every process (DDP), one row per scene name,
    and writes ``<stem>.md/.csv/.json`` on rank 0 (see ``write_table``); ``rows`` holds them."""

    def __init__(self, stem: str, title: str = ""):
        self.stem, self.title = Path(stem), title
        self.rows: list[dict] = []

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        rows = list(pl_module.rows)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, rows)
            rows = [r for part in gathered for r in part]
        # DistributedSampler pads uneven splits with repeated scenes: keep one row per name
        self.rows = sorted({r["name"]: r for r in rows}.values(), key=lambda r: r["name"])
        if trainer.is_global_zero:
            self.paths = write_table(self.rows, self.stem, self.title)
