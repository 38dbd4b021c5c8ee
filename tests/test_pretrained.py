"""Shipped models (cassi/pretrained/<name>.ckpt + <name>.md card + <name>.reference.pt) and the model-card job."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cassi import CASSI
from cassi.models import load_model
from cassi.models.card import reference_input, reference_output, reference_psnr
from cassi.models.checkpoint import PRETRAINED_DIR

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in PRETRAINED_DIR.glob("*.ckpt"))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_reproduces_its_card(name):
    """Loaded by name, the model gives its stored reference output (atol 1e-4) and the PSNR its card states
    on the fixed reference input (within 0.01 dB); its weights stay under 10 MB."""
    model = load_model(f"pretrained/{name}")
    stored = torch.load(PRETRAINED_DIR / f"{name}.reference.pt", weights_only=True)
    x, op = reference_input(model)
    assert torch.equal(stored["x"], x) and torch.equal(stored["mask"], op.mask)
    assert torch.allclose(reference_output(model), stored["out"], atol=1e-4)
    card = (PRETRAINED_DIR / f"{name}.md").read_text()
    stated = float(re.search(r"reference \| PSNR ([0-9.]+) dB", card).group(1))
    assert abs(reference_psnr(model) - stated) < 0.01
    assert "## Validation" in card and "## Test" in card and "GAP-TV" in card
    assert (PRETRAINED_DIR / f"{name}.ckpt").stat().st_size < 10e6


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_refuses_another_geometry(name):
    model = load_model(f"pretrained/{name}")
    op = CASSI(torch.ones(16, 16), bands=model.bands, step=1)
    with pytest.raises(ValueError, match=rf"pretrained/{name}.ckpt was trained for dispersion offsets"):
        model(op, op(torch.rand(1, model.bands, 16, 16)))


def test_model_card_job_ships_a_model_that_loads_by_name(tmp_path):
    """model_card.py on a tiny trained checkpoint: card with the three methods on both splits, weights-only file,
    reference output; load_model of the shipped file reproduces the reference; a bad ckpt fails cleanly."""
    run = tmp_path / "train"
    tiny = ["model.stages=2", "model.width=4", "model.depth=2", "bands=6", "wavelengths=null", "data.train.n=4",
            "data.train.height=16", "data.train.width=16", "data.val.n=1", "data.val.height=16", "data.val.width=16",
            "data.batch_size=4", "trainer.accelerator=cpu", "callbacks.progress=null", "callbacks.summary=null",
            "trainer.max_steps=2", "trainer.max_epochs=-1", "test=false"]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "train.py"), *tiny, f"hydra.run.dir={run}"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    ckpt = next((run / "checkpoints").glob("best-*.ckpt"))
    small = [f"{s}.test.{k}={v}" for s in ("validation", "test") for k, v in (("n", 2), ("height", 16), ("width", 20))]
    common = ["name=tiny", "bands=6", "data@validation=synthetic", "data@test=synthetic", "validation.train.bands=6",
              "test.train.bands=6", "baselines.gap_tv.iters=5", *small, f"out_dir={tmp_path / 'shipped'}",
              f"hydra.run.dir={tmp_path / 'card'}"]
    (tmp_path / "notes.md").write_text("## Recipe\n\nThe notes of the tiny model.\n")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "model_card.py"), f"ckpt={ckpt}", "ship=true",
                        f"notes={tmp_path / 'notes.md'}", *common], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    card = (tmp_path / "shipped" / "tiny.md").read_text()
    assert "## Recipe\n\nThe notes of the tiny model." in card  # notes from a file
    assert card.count("| **mean** |") == 2 and card.count("A⁺y PSNR") == 2 and "tiny PSNR" in card
    assert "2 optimizer steps" in card
    model = load_model(tmp_path / "shipped" / "tiny.ckpt")
    stored = torch.load(tmp_path / "shipped" / "tiny.reference.pt", weights_only=True)
    assert torch.allclose(reference_output(model), stored["out"], atol=1e-4)
    stated = float(re.search(r"reference \| PSNR ([0-9.]+) dB", card).group(1))
    assert abs(reference_psnr(model) - stated) < 0.01
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "model_card.py"), f"ckpt={tmp_path / 'none.ckpt'}",
                        *common], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "none.ckpt does not exist" in r.stderr
