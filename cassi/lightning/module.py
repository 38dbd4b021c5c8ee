"""LightningModule that reconstructs CASSI batches with any reconstructor.

A reconstructor is a callable ``(op, y, gt=None) -> result`` where ``result`` has
``.x`` (B, C, H, W) and optionally ``.iterations`` — every iterative solver in
``cassi.solvers`` and every trained model wrapper qualifies. Batches follow the
data contract of ``cassi.data``: ``{"y": (B,1,H,W'), "mask": (B,1|C,H,W),
"x": ground truth (optional), "name": [str]}``; one operator is built per batch
from the per-sample masks with the configured geometry.
"""
from __future__ import annotations

import re
import time
from typing import Callable

import lightning as L
import torch

from cassi import CASSI, threads
from cassi.metrics import all_metrics

class ReconstructionModule(L.LightningModule):
    """Runs ``reconstructor`` in ``test_step`` (with metrics) and ``predict_step``.

    Args:
        reconstructor: callable (op, y, gt=None) -> result with ``.x``.
        operator: callable ``mask -> CASSI`` (a Hydra partial of ``cassi.CASSI``
            carrying bands/step/offsets/axis/backend).
        skip: optional callable ``name -> bool``: ``predict_step`` does not reconstruct a batch whose
            every scene it accepts (e.g. :meth:`cassi.lightning.callbacks.CubeWriter.complete`).
        baseline: optional second reconstructor run beside it in ``predict_step`` (e.g. GAP-TV beside a
            trained model): its estimate, stats and metrics come back under "baseline".
    After ``trainer.test``, ``self.rows`` holds one dict per scene of this process (name,
    metrics, time in s, iterations); :class:`cassi.lightning.callbacks.ResultsTable` gathers
    them over processes and writes the table.
    """

    def __init__(self, reconstructor: Callable, operator: Callable[..., CASSI],
                 skip: Callable[[str], bool] | None = None, baseline: Callable | None = None):
        super().__init__()
        self.reconstructor, self.baseline = reconstructor, baseline
        self.operator = operator
        self.skip = skip
        self.rows: list[dict] = []

    def reconstruct(self, batch: dict, reconstructor: Callable | None = None) -> tuple[torch.Tensor, dict]:
        """(B, C, H, W) reconstruction of ``batch["y"]`` (by ``reconstructor``, default this module's) and stats:
        time per scene, iterations, and the relative residual ‖y − A x‖/‖y‖ per scene ("residual", (B,))."""
        op = self.operator(mask=batch["mask"]).to(batch["y"].device)
        threads.adapt()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            result = (reconstructor or self.reconstructor)(op, batch["y"], gt=batch.get("x"))
            x = getattr(result, "x", result)
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            y = batch["y"].flatten(1)
            residual = torch.linalg.vector_norm(y - op(x.to(op.mask.dtype)).flatten(1), dim=1) / \
                torch.linalg.vector_norm(y, dim=1).clamp_min(torch.finfo(y.dtype).tiny)
        return x, {"time": seconds / x.shape[0], "iterations": getattr(result, "iterations", None),
                   "residual": residual}

    def test_step(self, batch: dict, batch_idx: int) -> None:
        if "x" not in batch:
            raise ValueError("test needs ground truth: the batch has no 'x' (use predict for real measurements)")
        x, stats = self.reconstruct(batch)
        scores = all_metrics(x, batch["x"])
        names = batch.get("name") or [f"scene{batch_idx}_{i}" for i in range(x.shape[0])]
        residual = stats.pop("residual")
        for i, name in enumerate(names):
            self.rows.append({"name": name, **{k: float(v[i]) for k, v in scores.items()}, **stats,
                              "residual": float(residual[i])})
        for k, v in scores.items():
            self.log(f"test/{k}", v.mean(), batch_size=x.shape[0], sync_dist=True, prog_bar=k in ("psnr", "ssim"))

    def predict_step(self, batch: dict, batch_idx: int) -> dict:
        """{"x", "name", "time", "iterations", "residual", "metrics" (with ground truth), "baseline" (with a
        baseline: {"x", "time", "iterations", "residual", "metrics"})}; or
        {"name", "skipped": True} when ``skip`` accepts every scene; or {"name", "error": "Type: message"}
        when the reconstruction raises (so that one bad scene does not stop the others); a baseline that
        raises gives "baseline": {"error": ...} beside the method's result. Inputs that failed to load (the
        batch's "failed" (name, reason) pairs, see ``cassi.data.datasets.collate``) come back as "failed"."""
        failed = {"failed": list(batch["failed"])} if batch.get("failed") else {}
        if failed and "y" not in batch:  # every input of the batch failed to load
            return {"name": [], **failed}
        names = batch.get("name") or [f"scene{batch_idx}_{i}" for i in range(batch["y"].shape[0])]
        if self.skip is not None and all(self.skip(n) for n in names):
            return {"name": names, "skipped": True, **failed}
        def run(reconstructor) -> dict:
            try:
                x, stats = self.reconstruct(batch, reconstructor)
            except Exception as e:  # noqa: BLE001 - reported per scene by the writer, the run goes on
                return {"error": f"{type(e).__name__}: {e}"}
            return {"x": x, **stats} | ({"metrics": all_metrics(x, batch["x"])} if "x" in batch else {})

        out = {"name": names, **run(self.reconstructor), **failed}
        if self.baseline is not None and "error" not in out:  # a failing baseline keeps the method's result
            out["baseline"] = run(self.baseline)
        return out

    def on_test_epoch_start(self) -> None:
        self.rows = []

    def teardown(self, stage: str) -> None:
        """A spawned rank (``ddp_spawn``) ends when this call returns: release the process group here, after a
        barrier, while every rank is still alive. Left to interpreter exit, gloo tears down racing its peer's exit
        (a rank then aborted with "terminate called without an active exception" after a complete run)."""
        import torch.distributed as dist
        from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher

        if (dist.is_available() and dist.is_initialized()
                and isinstance(getattr(self.trainer.strategy, "launcher", None), _MultiProcessingLauncher)):
            dist.barrier()
            dist.destroy_process_group()


def _columns(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(k for r in rows for k in r)) or ["name"]


def summarize(rows: list[dict]) -> dict:
    """Mean of every numeric column over the scenes that have a value (failed scenes have none)."""
    means = {}
    for k in _columns(rows):
        vals = [r[k] for r in rows if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)]
        if vals and k != "name":
            means[k] = sum(vals) / len(vals)
    return means


def write_table(rows: list[dict], path_stem, title: str = "") -> list:
    """Per-scene table plus mean as Markdown, CSV and JSON (each written atomically). Returns the paths."""
    import csv
    import io
    import json
    from pathlib import Path

    from cassi.io import write_text_atomic

    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    mean = {"name": "mean", **summarize(rows)}
    cols = _columns(rows)
    fmt = lambda v: "" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))  # noqa: E731
    md = ([f"# {title}", ""] if title else []) + ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    md += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in [*rows, mean]]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=cols, restval="")
    writer.writeheader()
    writer.writerows([*rows, mean])
    outputs = {".md": "\n".join(md) + "\n", ".csv": buf.getvalue(),
               ".json": json.dumps({"scenes": rows, "mean": mean}, indent=1)}
    return [write_text_atomic(stem.with_suffix(ext), text) for ext, text in outputs.items()]


def _cell(key: str, value) -> str:
    """A number as a person reads it: PSNR / SAM 2 decimals, SSIM / residual 3, seconds 3 significant digits."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return "" if value is None else str(value)
    if key.endswith("time"):
        return f"{value:.3g}"
    if key.endswith(("ssim", "ssim_table", "residual")):
        return f"{value:.3f}"
    if key.endswith(("psnr", "psnr_table", "sam")):
        return f"{value:.2f}"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def short_name(title: str | None, default: str = "") -> str:
    """The class a reconstructor's repr names, past wrappers: "Tiled(GAPTV(iters=80), size=512)" -> "GAPTV"."""
    names = re.findall(r"([A-Za-z_]\w*)\(", title or "")
    return next((n for n in names if n != "Tiled"), names[0] if names else default)


def terminal_table(rows: list[dict], columns: dict[str, str], title: str = "", caption: str = "",
                   mean: bool | list[dict] = True):
    """The few ``columns`` ({key: header}) of a per-scene table that a person reads, and the mean, as a
    ``rich.table.Table`` that fits the console it is printed on: a cell too long for its column wraps (at
    spaces; a word longer than the column, e.g. a long file name, is folded onto the next lines), never cut to
    "…". ``mean``: True for the mean of ``rows`` as the last row, or the rows to show there. The files
    :func:`write_table` writes keep every column; this is what the scripts print."""
    from rich import box
    from rich.table import Table

    table = Table(title=title or None, caption=caption or None, box=box.SIMPLE_HEAD, show_edge=False,
                  padding=0, title_justify="left", caption_justify="left")  # columns one space apart
    for key, header in columns.items():  # text wraps at spaces where it must (a long word is folded), numbers never
        text = key in ("name", "method", "status", "error")
        table.add_column(header, overflow="fold", no_wrap=not text, justify="left" if text else "right")
    for r in rows:
        table.add_row(*(_cell(k, r.get(k)) for k in columns))
    for r in [{"name": "mean", **summarize(rows)}] if mean is True and rows else list(mean or []):
        table.add_row(*(_cell(k, r.get(k)) for k in columns), style="bold")
    return table
