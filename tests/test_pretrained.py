"""Shipped models (cassi/pretrained/<name>.ckpt + <name>.md card + <name>.reference.pt) and the model-card job."""
import logging
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


# each card's test split, as its card command gave it (the cards name the command)
CARD_TEST = {"cave_tsa": [], "cave_any": ["camera=many"],
             "tsa_real": ["camera=tsa_real", "solver@baselines.gap_tv=gap_tv_real"],
             "chart_demo": ["data@validation=chart_val", "data@test=chart"],
             "synthetic_demo": ["data@validation=synthetic", "+validation.test.wavelengths=tsa", "data@test=synthetic",
                                "+test.test.wavelengths=tsa"]}


def _card_means(card: str) -> tuple[float, float]:
    """(GAP-TV, model) mean PSNR of a card's test table."""
    test = card[card.index("## Test"):]
    cells = re.search(r"^\| \*\*mean\*\* \|(.*)\|$", test, re.M).group(1).split("|")
    return float(cells[1].split("/")[0]), float(cells[2].split("/")[0])


@pytest.mark.parametrize("name", SHIPPED)
def test_each_card_s_test_table_is_measured_again(name, shared_data):
    """The model and GAP-TV on its card's test scenes, now: within 0.05 dB of the card's means, the model above."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from cassi.workflows.card import mean_psnr, score

    assert set(CARD_TEST) == set(SHIPPED), "a shipped model without its card's test split here"
    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("model_card", overrides=[f"ckpt=pretrained/{name}", f"name={name}", *CARD_TEST[name],
                                               f"paths.shared_data={shared_data}", "threads=1"])
    operator = instantiate(cfg.operator)
    model, gap_tv = load_model(cfg.ckpt, operator=operator), instantiate(cfg.baselines.gap_tv)
    stated_gap, stated_model = _card_means((PRETRAINED_DIR / f"{name}.md").read_text())
    measured_gap = mean_psnr(score(cfg, gap_tv, operator, "test"))
    measured_model = mean_psnr(score(cfg, model, operator, "test"))
    assert measured_model == pytest.approx(stated_model, abs=0.05)
    assert measured_gap == pytest.approx(stated_gap, abs=0.05)
    assert measured_model > measured_gap


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_model_refuses_another_geometry(name):
    model = load_model(f"pretrained/{name}")
    op = CASSI(torch.ones(16, 16), bands=model.bands, step=1)
    with pytest.raises(ValueError, match=rf"pretrained/{name}.ckpt was trained for dispersion offsets"):
        model(op, op(torch.rand(1, model.bands, 16, 16)))


@pytest.mark.slow
def test_model_card_job_ships_a_model_that_loads_by_name(tmp_path, caplog):
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
    # shipped outside cassi/pretrained: the card names the file that loads it, not pretrained/tiny
    assert f"load_model('{tmp_path / 'shipped' / 'tiny.ckpt'}')" in card and "pretrained/tiny" not in card
    assert "## Recipe\n\nThe notes of the tiny model." in card  # notes from a file
    assert card.count("| **mean** |") == 2 and card.count("A⁺y PSNR") == 2 and "tiny PSNR" in card
    assert "| training | 2 optimizer steps, " in card and ": all of it (one piece, from scratch) |" in card
    model = load_model(tmp_path / "shipped" / "tiny.ckpt")
    # the table across masks, kept in the weights: a mask like one of its rows is named with its measured gain
    rows = {r["label"]: r for r in model.camera["measured"]}
    assert {"bernoulli_0.5", "blocks2_0.3"} <= set(rows) and "## Across masks" in card
    r = rows["blocks2_0.3"]
    assert f"| blocks2_0.3 | {r['psnr']:.2f} | {r['gap_tv']:.2f} | {r['gain']:+.2f} |" in card
    blocks = torch.zeros(80)
    blocks[torch.randperm(80, generator=torch.Generator().manual_seed(3))[:24]] = 1  # fill 0.3 exactly
    blocks = blocks.view(8, 10)
    with caplog.at_level(logging.WARNING, logger="cassi.models"):
        model(op := CASSI(blocks.repeat_interleave(2, 0).repeat_interleave(2, 1), bands=6, step=2),
              op(torch.rand(1, 6, 16, 20)))
    assert f"its card measured {r['gain']:+.2f} dB against GAP-TV on blocks2_0.3" in caplog.text
    stored = torch.load(tmp_path / "shipped" / "tiny.reference.pt", weights_only=True)
    assert torch.allclose(reference_output(model), stored["out"], atol=1e-4)
    stated = float(re.search(r"reference \| PSNR ([0-9.]+) dB", card).group(1))
    assert abs(reference_psnr(model) - stated) < 0.01
    # measure=across_masks: the shipped model's table redone in place (here one other mask); nothing else changes
    shipped = tmp_path / "shipped" / "tiny.ckpt"
    one = ["~across_masks", "+across_masks={blocks4: {mask: null, masks: blocks, fill: 0.5, block: 4, mixture: null}}"]
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "model_card.py"), f"ckpt={ckpt}", "measure=across_masks",
                        *one, *common], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and f"ckpt must be {shipped}" in r.stderr  # not the shipped weights: refused
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "model_card.py"), f"ckpt={shipped}",
                        "measure=across_masks", *one, *common], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    redone = (tmp_path / "shipped" / "tiny.md").read_text()
    (row,) = load_model(shipped).camera["measured"]
    assert row["label"] == "blocks4" and f"| blocks4 | {row['psnr']:.2f} | {row['gap_tv']:.2f} |" in redone
    kept = [line for line in card.splitlines() if not line.startswith(("| bernoulli", "| blocks", "| tsa_"))]
    assert [line for line in redone.splitlines() if not line.startswith("| blocks4 |")] == kept
    after = load_model(shipped).state_dict()
    assert all(torch.equal(v, after[k]) and v.dtype == after[k].dtype for k, v in model.state_dict().items())
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "model_card.py"), f"ckpt={tmp_path / 'none.ckpt'}",
                        *common], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "none.ckpt does not exist" in r.stderr


def test_cards_state_the_training_of_every_init_weights_piece(tmp_path):
    """A card stated the last piece's steps and CPU time only (cave_tsa: 0.70 of 14.1 CPU-hours): checkpoints now
    carry what the weights they started from hold, through weights-only files and resumes, and cards sum it."""
    from functools import partial

    from cassi.lightning import TrainingModule
    from cassi.models import GAPNet, export_weights
    from cassi.models.card import card_markdown, training_record

    op = partial(CASSI, bands=4, step=2, backend="loop")

    def piece(path, steps, cpu_min, init=None, **kw):
        """A training checkpoint as Lightning writes it: steps, the ElapsedTime state, weights, cassi's entry."""
        module = TrainingModule(GAPNet(bands=4, stages=1, width=4, depth=2), op, init_weights=init, **kw)
        ckpt = {"global_step": steps, "callbacks": {"ElapsedTime": {"cpu_min": cpu_min, "wall_min": 2 * cpu_min}},
                "state_dict": {f"reconstructor.{k}": v for k, v in module.reconstructor.state_dict().items()}}
        module.on_save_checkpoint(ckpt)
        torch.save(ckpt, path)
        return ckpt

    first = piece(tmp_path / "p1.ckpt", 30, 6.0)
    assert training_record(first)["pieces"] == 1 and training_record(first)["complete"]
    export_weights(tmp_path / "p1.ckpt", tmp_path / "p1.weights.ckpt")  # weights only: the record goes with them
    second = piece(tmp_path / "p2.ckpt", 50, 12.0, init=str(tmp_path / "p1.weights.ckpt"))
    third = piece(tmp_path / "p3.ckpt", 20, 3.0, init=str(tmp_path / "p2.ckpt"))
    record = training_record(third)
    assert {k: record[k] for k in ("pieces", "steps", "cpu_min", "wall_min", "complete")} == {
        "pieces": 3, "steps": 100, "cpu_min": 21.0, "wall_min": 42.0, "complete": True}
    assert record["last"] == {"steps": 20, "cpu_min": 3.0, "wall_min": 6.0}
    resumed = TrainingModule(GAPNet(bands=4, stages=1, width=4, depth=2), op)  # ckpt_path= restores the record
    resumed.on_load_checkpoint(third)
    assert resumed.trained_before == third["cassi"]["trained_before"] != {"pieces": 0}

    results = {split: {"m": [{"name": "a", "psnr": 20.0, "ssim": 0.5, "sam": 9.0, "time": 0.1}]}
               for split in ("validation", "test")}
    card = card_markdown("tiny", load_model(tmp_path / "p3.ckpt"), third, results)
    assert ("| training | in all 3 pieces (an `init_weights=` chain), 100 optimizer steps, 0.35 CPU-hours (0.70 h "
            "wall); the last piece 20 optimizer steps, 0.05 CPU-hours (0.10 h wall) |") in card

    # a checkpoint written before the record (the shipped ones): its own piece only, said so; init_training fills in
    legacy = {**second, "cassi": {k: v for k, v in second["cassi"].items() if k != "trained_before"}}
    torch.save(legacy, tmp_path / "legacy.ckpt")
    assert "whether it started from trained weights" in card_markdown("tiny", load_model(tmp_path / "p3.ckpt"),
                                                                      legacy, results)
    unknown = training_record(piece(tmp_path / "p4.ckpt", 10, 1.0, init=str(tmp_path / "legacy.ckpt")))
    assert unknown["pieces"] == 2 and not unknown["complete"] and "pieces" in unknown["partial"]
    told = training_record(piece(tmp_path / "p5.ckpt", 10, 1.0, init=str(tmp_path / "legacy.ckpt"),
                                 init_training={"pieces": 2, "steps": 80, "cpu_min": 18.0, "wall_min": 36.0}))
    assert (told["pieces"], told["steps"], told["cpu_min"], told["complete"]) == (3, 90, 19.0, True)
    with pytest.raises(ValueError, match="init_training describes the training of init_weights"):
        TrainingModule(GAPNet(bands=4, stages=1, width=4, depth=2), op, init_training={"pieces": 2})


def test_the_table_across_masks_is_set_in_a_card_and_nothing_else_changes():
    """model_card.py measure=across_masks on a shipped model: its card gains (or has replaced) the table across
    masks after the test table; the notes and every other line stay as they were."""
    from cassi.models.card import MASKS_HEADING, masks_section

    card = "# `m` — Refiner\n\n## Validation (the scenes its ...)\n\n| v |\n\n## Test (scenes never seen in ...)\n\n" \
           "| scene | x |\n|---|---|\n| a | 1 |\n\n## Notes\n\n| a table of the notes |\n\nThe end.\n"
    rows = [{"label": "bernoulli_0.5", "psnr": 30.0, "gap_tv": 29.0, "gain": 1.0}]
    once = masks_section(card, rows)
    assert once.replace("\n".join([MASKS_HEADING, "",
                                   "| mask | model PSNR | GAP-TV PSNR | gain (dB) |", "|---|---|---|---|",
                                   "| bernoulli_0.5 | 30.00 | 29.00 | +1.00 |", "", ""]), "") == card
    assert once.index("| a | 1 |") < once.index("## Across masks") < once.index("## Notes")
    twice = masks_section(once, [{**rows[0], "label": "blocks2_0.3", "gain": 2.0}])
    assert twice.count("## Across masks") == 1 and "bernoulli_0.5" not in twice and "| blocks2_0.3 |" in twice
    assert twice.replace("blocks2_0.3", "bernoulli_0.5").replace("+2.00", "+1.00") == once
    with pytest.raises(ValueError, match="no test table"):
        masks_section("# Some markdown\n\n## Validation\n", rows)
