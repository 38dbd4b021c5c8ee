"""Callbacks: write each reconstructed scene (cube, pictures, summary row) as it is predicted; show progress."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import BasePredictionWriter, Callback, Timer

from cassi import viz
from cassi.io import band_wavelengths, load_cube, save_cube, write_text_atomic
from cassi.lightning.module import short_name, summarize, terminal_table, write_table


log = logging.getLogger("cassi")


def _gather(obj: list) -> list:
    """Concatenate a list over DDP processes (the list itself without DDP)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, obj)
        return [o for part in parts for o in part]
    return list(obj)


def _predict_datasets(trainer) -> list:
    loaders = trainer.predict_dataloaders
    return [dl.dataset for dl in (loaders if isinstance(loaders, list) else [loaders])]


class CubeWriter(BasePredictionWriter):
    """Writes every predicted scene into the run folder ``output_dir`` and keeps its summary row.

    Per scene ``name``:

    - ``reconstructions/<name>.<fmt>``: the cube (atomic, with wavelengths and geometry);
    - with ``preview``: ``previews/<name>.png`` (sRGB from the spectrum, or labelled false colour without
      wavelengths: ``cassi.viz``), ``previews/<name>_bands.png`` (band mosaic), ``previews/<name>_spectra.png``
      (spectra of a few points) and, with ground truth, ``previews/<name>_compare.png`` (truth | reconstruction
      | error); with a baseline beside the method (``ReconstructionModule(baseline=...)``),
      ``previews/<name>_baseline.png`` and ``previews/<name>_baseline_compare.png``, and its metrics, residual
      and time as ``baseline_*`` columns;
    - ``scenes/<name>.json``: its summary row and files, written last: a scene is *complete* when this record
      and every file it lists are present and readable (:meth:`complete`), which a half-written scene never is
      (every file is written atomically and the old record is removed first).

    After predicting, ``summary.{md,csv,json}`` (per scene: metrics with ground truth, relative residual
    ‖y − A x‖/‖y‖, time, iterations, status, error) and ``index.html`` (one row per scene: preview, metrics or
    error, time, spectra) are written on rank 0. ``rows`` holds the summary rows of this run (DDP: of all
    processes); ``failed`` the (name, one-line reason) of every scene that was not reconstructed: inputs the
    dataset refused (its ``skipped`` list) or that failed to load (a batch's "failed" list), reconstructions
    that raised, outputs that could not be written.

    Args:
        output_dir: the run folder.
        fmt: cube format: tif (OME-TIFF), mat, h5, npy, npz.
        wavelengths: nm per band, or 'tsa' / 'cave'; must have ``meta["bands"]`` entries when both are given.
        meta: stored with each cube (geometry: bands, step or offsets, axis).
        overwrite: redo every scene; False (default): keep complete scenes, redo the others.
        nonnegative: clamp negative estimates (iterative estimates undershoot slightly at edges) to 0, as
            spectral radiance is ≥ 0 and ``cassi.io.load_cube`` rejects negative cubes.
        preview: write the pictures.
    """

    def __init__(self, output_dir: str, fmt: str = "tif", wavelengths=None, meta: dict | None = None,
                 overwrite: bool = False, nonnegative: bool = True, preview: bool = True):
        super().__init__(write_interval="batch")
        self.nonnegative, self.overwrite, self.preview = nonnegative, overwrite, preview
        self.output_dir, self.fmt = Path(output_dir), fmt.lstrip(".")
        self.meta = {k: v for k, v in dict(meta or {}).items() if v is not None}
        self.wavelengths = band_wavelengths(wavelengths, self.meta.get("bands"), "the reconstructions have")
        self.written: list[Path] = []
        self.rows: list[dict] = []
        self.failed: list[tuple[str, str]] = []
        self.summary_paths: list[Path] = []
        self._records: dict[str, dict] = {}
        self._seen: set[str] = set()
        self.baseline, self.baseline_title = False, None  # on_predict_start: a baseline runs beside the method
        self._labels, self._region_names = ("method", "baseline"), None  # on_predict_start: for patch spectra
        self.title = ""  # on_predict_end: the method's repr

    # ------------------------------------------------------------------ files
    def files(self, name: str, truth: bool) -> dict[str, str]:
        """The outputs of scene ``name``, relative to ``output_dir``."""
        files = {"cube": f"reconstructions/{name}.{self.fmt}"}
        if self.preview:
            files.update(preview=f"previews/{name}.png", mosaic=f"previews/{name}_bands.png",
                         spectra=f"previews/{name}_spectra.png")
            if truth:
                files["compare"] = f"previews/{name}_compare.png"
            if self.baseline:
                files.update(self._baseline_files(name, truth))
        return files

    @staticmethod
    def _baseline_files(name: str, truth: bool = True) -> dict[str, str]:
        """The baseline's pictures of scene ``name`` (its comparison only with ground truth)."""
        return {kind: f"previews/{name}_{kind}.png" for kind in ("baseline", "baseline_compare")[:1 + truth]}

    def _record_path(self, name: str) -> Path:
        return self.output_dir / "scenes" / f"{name}.json"

    def complete(self, name: str) -> bool:
        """True when ``name`` was written before: its record and every output asked for now (``files``) are
        present and readable (the cube loads, the pictures decode), beside the same baseline as now (none, or
        one with the same repr, which succeeded). Always False with ``overwrite``."""
        if self.overwrite:
            return False
        if name in self._records:
            return True
        try:
            record = json.loads(self._record_path(name).read_text())
            expected = self.files(name, record["truth"])
            if (any(record["files"].get(kind) != rel for kind, rel in expected.items())
                    or record.get("baseline") != self.baseline_title):
                return False
            import matplotlib.image

            for kind, rel in {**record["files"], **expected}.items():  # and those only some scenes have
                path = self.output_dir / rel
                load_cube(path, max_bytes=None) if kind == "cube" else matplotlib.image.imread(path)  # our own output
        except Exception:  # noqa: BLE001 - missing, half-written or unreadable: not complete
            return False
        self._records[name] = record
        return True

    def _write_scene(self, name: str, x: torch.Tensor, gt: torch.Tensor | None, row: dict,
                     base: torch.Tensor | None = None, regions: torch.Tensor | None = None) -> dict:
        """Write the cube and pictures of one scene (and of the baseline's estimate ``base``), then its record;
        returns its files. With ground truth and a label map ``regions`` (H, W) (the item's "regions", e.g. a
        colour chart's patches), also ``previews/<name>_patch_spectra.png``: each patch's spectrum, the method's
        and the baseline's against the truth (``viz.save_patch_spectra``)."""
        self._record_path(name).unlink(missing_ok=True)  # until the record is back, the scene is incomplete
        files = self.files(name, gt is not None)
        if base is None:  # no baseline estimate (none asked for, or it failed): no baseline pictures, old ones go
            for kind, rel in self._baseline_files(name).items():
                files.pop(kind, None)
                (self.output_dir / rel).unlink(missing_ok=True)
        out = {k: self.output_dir / v for k, v in files.items()}
        self.written.append(save_cube(out["cube"], x, wavelengths=self.wavelengths, meta=self.meta, overwrite=True))
        if self.preview:
            viz.save_preview(out["preview"], x, self.wavelengths)
            viz.save_band_mosaic(out["mosaic"], x, self.wavelengths)
            viz.save_spectra(out["spectra"], x, self.wavelengths, truth=gt)
            if gt is not None:
                viz.save_comparison(out["compare"], gt, x, self.wavelengths, psnr=row.get("psnr"))
            if base is not None:
                viz.save_preview(out["baseline"], base, self.wavelengths)
                if gt is not None:
                    viz.save_comparison(out["baseline_compare"], gt, base, self.wavelengths,
                                        psnr=row.get("baseline_psnr"))
            if gt is not None and regions is not None and bool((regions > 0).any()):
                files["patch_spectra"] = f"previews/{name}_patch_spectra.png"
                method, baseline = self._labels
                viz.save_patch_spectra(self.output_dir / files["patch_spectra"], gt, regions,
                                       {method: x, **({baseline: base} if base is not None else {})},
                                       self.wavelengths, self._region_names)
        self._record_path(name).parent.mkdir(parents=True, exist_ok=True)
        record = {"row": row, "files": files, "truth": gt is not None,
                  "baseline": self.baseline_title if base is not None else None}
        write_text_atomic(self._record_path(name), json.dumps(record, indent=1))
        self._records[name] = record
        return files

    # ------------------------------------------------------------------ hooks
    def on_predict_start(self, trainer, pl_module) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.baseline = getattr(pl_module, "baseline", None) is not None
        self.baseline_title = repr(pl_module.baseline) if self.baseline else None
        method = viz.method_label(repr(pl_module.reconstructor))  # the patch-spectra picture's labels and names
        self._labels = (method, f"{viz.method_label(self.baseline_title, 'baseline')} (baseline)")
        self._region_names = next((ds.region_names for ds in _predict_datasets(trainer)
                                   if getattr(ds, "region_names", None) is not None), None)
        self.rows, self.failed, self.written, self._seen = [], [], [], set()
        for ds in _predict_datasets(trainer):
            for path, reason in getattr(ds, "skipped", []):  # inputs the dataset refused before any work
                self._fail(Path(path).stem, reason)

    def _fail(self, name: str, reason: str) -> None:
        reason = " ".join(str(reason).split())  # one line
        log.error("%s failed: %s", name, reason)
        self.failed.append((name, reason))
        self.rows.append({"name": name, "status": "failed", "error": reason})

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx=0):
        for name, reason in prediction.get("failed") or []:  # inputs that failed to load
            self._fail(name, reason)
        names = list(prediction["name"])
        if not names:
            return
        if prediction.get("error"):
            for name in names:
                self._fail(name, prediction["error"])
            return
        x = None if prediction.get("skipped") else prediction["x"].detach().float().cpu()
        if x is not None and self.nonnegative:
            x = x.clamp_min(0)
        gt, regions = batch.get("x"), batch.get("regions")
        metrics = prediction.get("metrics", {})
        for i, name in enumerate(names):
            if name in self._seen:
                self._fail(name, f"another input of this run has the same name {name!r}: its outputs are kept")
                continue
            self._seen.add(name)
            if x is None or self.complete(name):
                self.rows.append({**self._records[name]["row"], "status": "complete: kept",
                                  "files": self._records[name]["files"]})
                continue
            row = {"name": name, **{k: float(v[i]) for k, v in metrics.items()},
                   "residual": float(prediction["residual"][i]), "time": prediction["time"],
                   "iterations": prediction["iterations"]}
            base = prediction.get("baseline")
            if base is not None and "error" in base:  # the method's result is written; the run reports it
                row["baseline_error"] = " ".join(base["error"].split())
                log.error("%s: the baseline failed: %s", name, row["baseline_error"])
                self.failed.append((name, f"baseline: {row['baseline_error']}"))
                base = None
            elif base is not None:
                row.update({f"baseline_{k}": float(v[i]) for k, v in base.get("metrics", {}).items()})
                row.update(baseline_residual=float(base["residual"][i]), baseline_time=base["time"])
                base = base["x"][i].detach().float().cpu()
                base = base.clamp_min(0) if self.nonnegative else base
            try:
                files = self._write_scene(name, x[i], None if gt is None else gt[i].detach().float().cpu(), row,
                                          base, regions=None if regions is None else regions[i].cpu())
            except Exception as e:  # noqa: BLE001 - one scene that cannot be written must not lose the others
                self._fail(name, f"could not write its outputs: {type(e).__name__}: {e}")
                continue
            self.rows.append({**row, "status": "reconstructed", "files": files})

    def on_predict_end(self, trainer, pl_module) -> None:
        self.rows, self.failed = _gather(self.rows), _gather(self.failed)
        if not trainer.is_global_zero:
            return
        self.rows.sort(key=lambda r: r["name"])
        title = self.title = repr(pl_module.reconstructor)
        keys = [k for k in dict.fromkeys(k for r in self.rows for k in r) if k not in ("name", "status", "error", "files")]
        keys = ["name", *keys, "status", *(["error"] if self.failed else [])]
        table = [{k: r.get(k) for k in keys} for r in self.rows]
        self.summary_paths = write_table(table, self.output_dir / "summary", title)
        bands = self.meta.get("bands") or (len(self.wavelengths) if self.wavelengths else None)
        notes = [f"Method: {title}"] + ([f"Baseline beside it (baseline_* columns): {self.baseline_title}"]
                                        if self.baseline else []) + [
                 f"Pictures: {viz.rendering(self.wavelengths, bands)}; exposure: auto (99th percentile of "
                 f"the luminance); error maps: spectral RMSE. Table: summary.md, summary.csv, summary.json."]
        page = viz.report_html(self.rows, f"cassi reconstruct: {self.output_dir.name}", notes)
        self.summary_paths.append(write_text_atomic(self.output_dir / "index.html", page))

    def terminal_table(self):
        """The summary as a person reads it in a terminal (a ``rich.table.Table`` that fits the console: cells
        wrap, none is cut): per scene and their mean, PSNR and SSIM with ground truth (else the relative
        residual), time and status; with a baseline, a second line per scene for it. summary.{md,csv,json} have
        every column."""
        have = {k for r in self.rows for k, v in r.items() if v is not None}
        metrics = ["psnr", "ssim"] if "psnr" in have else ["residual"]
        columns = {"name": "scene", **({"method": "method"} if self.baseline else {}),
                   **{k: k.upper() if k != "residual" else k for k in metrics}, "time": "time (s)", "status": "status"}
        if not self.baseline:
            return terminal_table(self.rows, columns, title=self.title,
                                  caption="every column: summary.md, summary.csv, summary.json")
        method, base = short_name(self.title, "method"), short_name(self.baseline_title, "baseline")
        rows, ours, theirs = [], [], []
        for r in self.rows:
            ours.append({**r, "method": method})
            theirs.append({k[len("baseline_"):]: v for k, v in r.items() if k.startswith("baseline_")})
            rows.append(ours[-1])
            if any(k in theirs[-1] for k in ("time", "error")):  # a row for the baseline where it ran
                theirs[-1].update(method=base, status="failed" if "error" in theirs[-1] else None)
                rows.append(theirs[-1])
        means = [{"name": "mean", **summarize(ours), "method": method},
                 {"name": "", **summarize([t for t in theirs if "time" in t]), "method": base}]
        return terminal_table(rows, columns, title=self.title, mean=means,
                              caption=f"{base}: {self.baseline_title}\nevery column: summary.md, summary.csv, "
                                      f"summary.json")


class FileProgress(Callback):
    """A rich progress bar over input files (scenes), not batches: "reconstructing 3/6 files · <name>"."""

    def on_predict_start(self, trainer, pl_module) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = None
        if not trainer.is_global_zero:
            return
        total = sum(len(ds) for ds in _predict_datasets(trainer))
        self.progress = Progress(TextColumn("reconstructing"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("files"), TimeElapsedColumn(), TextColumn("{task.description}"))
        self.task = self.progress.add_task("", total=total)
        self.progress.start()

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if self.progress is not None:
            names = list(outputs.get("name") or []) + [name for name, _ in outputs.get("failed") or []]
            self.progress.update(self.task, advance=len(names), description=" ".join(names))

    def on_predict_end(self, trainer, pl_module) -> None:
        if self.progress is not None:
            self.progress.stop()


class ResultsTable(Callback):
    """After testing, gathers the per-scene rows of every process (DDP), one row per scene name,
    and writes ``<stem>.md/.csv/.json`` on rank 0 (see ``write_table``); ``rows`` holds them."""

    def __init__(self, stem: str, title: str = ""):
        self.stem, self.title = Path(stem), title
        self.rows: list[dict] = []

    def on_test_epoch_end(self, trainer, pl_module) -> None:
        rows = _gather(pl_module.rows)
        # DistributedSampler pads uneven splits with repeated scenes: keep one row per name
        self.rows = sorted({r["name"]: r for r in rows}.values(), key=lambda r: r["name"])
        if trainer.is_global_zero:
            self.paths = write_table(self.rows, self.stem, self.title)

    @staticmethod
    def terminal_table(rows: list[dict], title: str = "", caption: str = ""):
        """Per scene (and their mean) PSNR, SSIM, SAM and time, as a ``rich.table.Table`` that fits the console
        (cells wrap, none is cut); the written table has every column."""
        have = {k for r in rows for k in r}
        columns = {k: h for k, h in (("name", "scene"), ("psnr", "PSNR"), ("ssim", "SSIM"), ("sam", "SAM"),
                                     ("time", "time (s)")) if k in have}
        return terminal_table(rows, columns, title=title, caption=caption)


class ElapsedTime(Callback):
    """Logs the training cost so far at every validation: ``time/cpu_min`` (CPU-minutes of this process,
    all its threads: ``time.process_time``) and ``time/wall_min``, both summed over resumed pieces (kept in
    the checkpoint), so learning curves can be drawn against CPU-minutes instead of steps."""

    def __init__(self):
        self.cpu_min = self.wall_min = 0.0
        self._mark: tuple[float, float] | None = None

    def _advance(self) -> None:
        now = (time.process_time(), time.perf_counter())
        if self._mark is not None:
            self.cpu_min += (now[0] - self._mark[0]) / 60
            self.wall_min += (now[1] - self._mark[1]) / 60
        self._mark = now

    def on_train_start(self, trainer, pl_module) -> None:
        self._mark = None
        self._advance()

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        self._advance()
        pl_module.log_dict({"time/cpu_min": self.cpu_min, "time/wall_min": self.wall_min}, sync_dist=True)

    def on_train_end(self, trainer, pl_module) -> None:
        self._advance()

    def state_dict(self) -> dict:
        self._advance()
        return {"cpu_min": self.cpu_min, "wall_min": self.wall_min}

    def load_state_dict(self, state_dict: dict) -> None:
        self.cpu_min, self.wall_min = float(state_dict["cpu_min"]), float(state_dict["wall_min"])


class Deadline(Callback):
    """Ends training at a wall-clock time ``at`` (seconds since the epoch, ``time.time()``; None: no deadline),
    whatever came before the training loop (a pool computed in the data's setup, a resume): at the start of
    training it sets the budget of ``trainer.max_time``'s Timer to the time trained before (a resumed run's) plus
    what is left until ``at``, at least ``min_minutes``; the learning-rate cosine that follows the Timer
    (:func:`cassi.lightning.training.warmup_cosine`) ends there too. ``scripts/fit_camera.py`` gives its last phase
    the end of the budget, so that a pool faster than the plan priced it leaves its time to training."""

    def __init__(self, at: float | None = None, min_minutes: float = 1.0):
        self.at, self.min_minutes = at, float(min_minutes)

    def on_train_start(self, trainer, pl_module) -> None:
        if self.at is None:
            return
        timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
        if timer is None:
            raise ValueError("callbacks.deadline.at needs trainer.max_time (the Timer it resets)")
        left = max(float(self.at) - time.time(), 60 * self.min_minutes)
        timer._duration = timer.time_elapsed("train") + left
        log.info("deadline: training ends in %.1f min (%.1f min in all)", left / 60, timer._duration / 60)
