"""Main job: reconstruct CASSI measurements and write the cubes.

    python scripts/reconstruct.py                          # GAP-TV on generated scenes (no files needed)
    python scripts/reconstruct.py data=real solver=gap_tv_real wavelengths=tsa  # the five real TSA scenes
    python scripts/reconstruct.py data=measurements data.predict.entries='meas/*.mat' data.predict.mask=mask.mat
    python scripts/reconstruct.py solver=admm_tv operator.backend=strided writer.fmt=h5
Writes <output_dir>/reconstructions/<name>.<fmt> (with wavelengths and geometry) and summary.{md,csv,json}.
"""
from pathlib import Path

import hydra
import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig
from rich.console import Console
from rich.markdown import Markdown

from cassi.lightning.module import ReconstructionModule, write_table


@hydra.main(version_base="1.3", config_path="../conf", config_name="reconstruct")
def main(cfg: DictConfig) -> None:
    L.seed_everything(cfg.seed, workers=True)
    console = Console()
    datamodule = instantiate(cfg.data)
    module = ReconstructionModule(instantiate(cfg.solver), instantiate(cfg.operator, _partial_=True))
    writer = instantiate(cfg.writer)
    trainer = instantiate(cfg.trainer, callbacks=[*instantiate(cfg.trainer.callbacks), writer])
    predictions = trainer.predict(module, datamodule=datamodule)
    rows = []
    for p in predictions:
        for i, name in enumerate(p["name"]):
            scores = {k: float(v[i]) for k, v in p.get("metrics", {}).items()}
            rows.append({"name": name, **scores, "time": p["time"], "iterations": p["iterations"]})
    skipped = getattr(datamodule.datasets.get("predict"), "skipped", [])
    rows += [{"name": Path(path).stem, "error": msg} for path, msg in skipped]
    rows += [{"name": name, "error": msg} for name, msg in writer.failed]
    paths = write_table(rows, Path(cfg.paths.output_dir) / "summary", f"{module.reconstructor!r}")
    console.print(Markdown(paths[0].read_text()))
    console.print(f"wrote {len(writer.written)} reconstructions to {writer.output_dir} and {paths[0].with_suffix('.*')}")
    if skipped or writer.failed:
        console.print(f"[red]{len(skipped) + len(writer.failed)} scene(s) failed; see the error column[/red]")


if __name__ == "__main__":
    main()
