"""Measurement simulation, the DataModule (splits, seeding, on-device simulation) and conf/data/*.yaml."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import scipy.io
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from torch.utils.data import ConcatDataset, Dataset

import cassi.io as io
from cassi import CASSI
from cassi.data import (BernoulliMasks, CubeFiles, FixedMask, GaussianNoise, RandomMaskCrops, Simulator,
                        SyntheticCubes, synthetic_batch)
from cassi.lightning.datamodule import CASSIDataModule

CONF = Path(__file__).resolve().parents[1] / "conf"


def shift_sum(x, mask, step=2):
    """Reference A x: y[b, 0, :, c*step + j] += mask[b, c or 0, :, j] * x[b, c, :, j]."""
    B, C, H, W = x.shape
    y = torch.zeros(B, 1, H, W + (C - 1) * step, dtype=torch.float64)
    for c in range(C):
        m = mask[:, c if mask.shape[1] > 1 else 0]
        y[:, 0, :, c * step:c * step + W] += (m * x[:, c]).double()
    return y.float()


def is_window(big, small):
    h, w = small.shape
    return any(torch.equal(big[t:t + h, s:s + w], small)
               for t in range(big.shape[0] - h + 1) for s in range(big.shape[1] - w + 1))


# ----------------------------------------------------------------------------- Simulator

@pytest.mark.parametrize("source", ["bernoulli", "crops", "fixed"])
def test_simulator_measures_with_the_mask_it_returns(source):
    big = torch.rand(24, 30)
    masks = {"bernoulli": BernoulliMasks(0.5), "crops": RandomMaskCrops(big), "fixed": FixedMask(big)}[source]
    x = synthetic_batch(3, 12, 16, bands=5, seed=1)
    out = Simulator(masks, bands=5, step=2, backend="strided")({"x": x, "name": ["a", "b", "c"]},
                                                              generator=torch.Generator().manual_seed(0))
    mask = out["mask"]
    assert mask.shape == (3, 1, 12, 16) and out["y"].shape == (3, 1, 12, 24) and out["name"] == ["a", "b", "c"]
    assert torch.allclose(out["y"], shift_sum(x, mask), atol=1e-5)
    if source == "bernoulli":
        assert set(mask.unique().tolist()) == {0.0, 1.0} and 0.3 < mask.mean() < 0.7
    if source == "crops":
        assert all(is_window(big, m[0]) for m in mask)
    if source == "fixed":
        assert torch.equal(mask[0, 0], big[6:18, 7:23]) and torch.equal(mask[0], mask[2])
    else:
        assert not torch.equal(mask[0], mask[1])  # a different mask per sample


def test_fixed_mask_crops_and_errors():
    big = torch.rand(3, 10, 12) + 0.1  # per-band mask
    m = FixedMask(big, crop="topleft")(2, 4, 5)
    assert m.shape == (2, 3, 4, 5) and torch.equal(m[1], big[:, :4, :5])
    assert torch.equal(FixedMask(big)(1, 4, 5)[0], big[:, 3:7, 3:8])
    with pytest.raises(ValueError, match="10×12 is smaller than the scene.*11×5"):
        FixedMask(big)(1, 11, 5)
    x = torch.rand(2, 3, 4, 5)
    out = Simulator(FixedMask(big), backend="loop")({"x": x})
    assert torch.allclose(out["y"], shift_sum(x, out["mask"]), atol=1e-5)


def test_simulator_noise_generator_existing_mask_and_geometry():
    x = synthetic_batch(2, 16, 16, bands=4, seed=2)
    sim = Simulator(BernoulliMasks(), step=2, backend="loop", noise=[GaussianNoise(0.05)])
    a = sim({"x": x}, generator=torch.Generator().manual_seed(5))
    b = sim({"x": x}, generator=torch.Generator().manual_seed(5))
    c = sim({"x": x}, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a["mask"], b["mask"]) and torch.equal(a["y"], b["y"])
    assert not torch.equal(a["mask"], c["mask"])
    noise = a["y"] - shift_sum(x, a["mask"])
    assert 0.04 < noise.std() < 0.06
    given = torch.ones(2, 1, 16, 16)
    assert torch.equal(Simulator(BernoulliMasks(), backend="loop")({"x": x, "mask": given})["mask"], given)
    frac = Simulator(BernoulliMasks(), offsets=[0, 1.5, 3, 4.5], axis="h", backend="loop")
    out = frac({"x": x})
    assert out["y"].shape == (2, 1, 16 + 5, 16)
    op = CASSI(out["mask"], bands=4, offsets=[0, 1.5, 3, 4.5], axis="h", backend="loop")
    assert torch.allclose(out["y"], op(x))
    with pytest.raises(ValueError, match="4 bands.*bands=28"):
        Simulator(BernoulliMasks(), bands=28)({"x": x})


# ----------------------------------------------------------------------------- DataModule

def write_cubes(folder, n, offset=0):
    folder.mkdir(parents=True, exist_ok=True)
    return [io.save_cube(folder / f"s{offset + i}.npy", np.random.rand(3, 12, 12).astype(np.float32), layout="chw")
            for i in range(n)]


def test_splits_must_not_overlap(tmp_path):
    write_cubes(tmp_path / "a", 3)
    write_cubes(tmp_path / "b", 2, offset=3)
    a, b = CubeFiles(tmp_path / "a"), CubeFiles(tmp_path / "b")
    CASSIDataModule(train=a, val=b, test=SyntheticCubes(2), predict=CubeFiles(tmp_path / "b"))  # predict may overlap
    with pytest.raises(ValueError, match="'val' and 'test'.*s0.npy"):  # same file through a glob and a list
        CASSIDataModule(train=b, val=CubeFiles(str(tmp_path / "a" / "*.npy")), test=CubeFiles(a.files[0]))
    with pytest.raises(ValueError, match="'train' and 'val'.*seeds 5..9"):
        CASSIDataModule(train=SyntheticCubes(10, seed=0), val=SyntheticCubes(10, seed=5))
    with pytest.raises(ValueError, match="'train' and 'test'"):
        CASSIDataModule(train=ConcatDataset([b, a]), test=CubeFiles(tmp_path / "a" / "s2.npy"))
    with pytest.raises(ValueError, match="same dataset object"):
        CASSIDataModule(val=a, test=a)


def train_names(dm, epoch=0):
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return [n for batch in loader for n in batch["name"]]


class Draws(Dataset):
    """Each sample reports the numpy / random / torch draws of its worker."""

    def __len__(self):
        return 4

    def __getitem__(self, i):
        import random
        return {"np": float(np.random.rand()), "py": random.random(), "torch": float(torch.rand(())), "name": str(i)}


def test_train_order_and_workers_are_seeded(tmp_path):
    ds = SyntheticCubes(12, 4, 4, bands=2)
    first = train_names(CASSIDataModule(train=ds, batch_size=5, seed=0))
    assert first == train_names(CASSIDataModule(train=ds, batch_size=5, seed=0))
    assert sorted(first) == sorted(ds[i]["name"] for i in range(12)) and first != [ds[i]["name"] for i in range(12)]
    assert first != train_names(CASSIDataModule(train=ds, batch_size=5, seed=1))
    assert first != train_names(CASSIDataModule(train=ds, batch_size=5, seed=0), epoch=1)
    files = CubeFiles(write_cubes(tmp_path, 2), patch_size=4)
    CASSIDataModule(train=files).train_dataloader().sampler.set_epoch(3)
    assert files.epoch == 3  # the sampler's epoch reaches the dataset (new crops)

    def draws(seed):
        dm = CASSIDataModule(val=Draws(), eval_batch_size=1, num_workers=2, seed=seed)
        return [(float(b["np"]), float(b["py"]), float(b["torch"])) for b in dm.val_dataloader()]

    d0 = draws(0)
    assert d0 == draws(0) and d0 != draws(1)
    assert len({d[0] for d in d0}) == 4 and d0[0][0] != d0[1][0]  # workers 0 and 1 differ


def test_on_after_batch_transfer_simulates_only_without_y():
    sim = Simulator(BernoulliMasks(), bands=3, backend="loop")
    dm = CASSIDataModule(test=SyntheticCubes(2, 8, 8, bands=3), simulator=sim)
    batch = next(iter(dm.test_dataloader()))
    assert set(batch) == {"x", "name"}
    out = dm.on_after_batch_transfer(batch, 0)
    assert out["y"].shape == (1, 1, 8, 12) and out["mask"].shape == (1, 1, 8, 8)
    assert torch.equal(out["y"], dm.on_after_batch_transfer(batch, 0)["y"])  # eval: deterministic per sample
    other = dm.on_after_batch_transfer({**batch, "name": ["another"]}, 0)
    assert not torch.equal(out["mask"], other["mask"])
    assert dm.on_after_batch_transfer(out, 0) is out  # has y: untouched
    real = {"y": torch.rand(1, 1, 8, 12), "mask": torch.ones(1, 1, 8, 8), "name": ["r"]}
    assert dm.on_after_batch_transfer(real, 0) is real
    # training draws from (seed, epoch, step, names): replayed exactly on resume, new at every step
    dm.trainer = SimpleNamespace(training=True, current_epoch=3, global_step=40)
    t1 = dm.on_after_batch_transfer(batch, 0)["mask"]
    assert torch.equal(t1, dm.on_after_batch_transfer(batch, 0)["mask"])
    assert not torch.equal(t1, out["mask"])  # not the evaluation mask of the same scene
    dm.trainer = SimpleNamespace(training=True, current_epoch=3, global_step=41)
    assert not torch.equal(t1, dm.on_after_batch_transfer(batch, 0)["mask"])
    with pytest.raises(ValueError, match="no simulator"):
        CASSIDataModule().on_after_batch_transfer(batch, 0)


class Probe(L.LightningModule):
    """Records what training and validation batches look like."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.seen = []

    def training_step(self, batch, i):
        self.seen.append(("train", self.current_epoch, batch["x"].clone(), batch["y"].shape, batch["mask"].shape))
        return self.w * batch["y"].mean()

    def validation_step(self, batch, i):
        self.seen.append(("val", self.current_epoch, batch["x"].clone(), batch["y"].shape, batch["mask"].shape))

    test_step = validation_step

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_trainer_fit_gets_simulated_batches_and_fresh_crops(tmp_path):
    train = CubeFiles(write_cubes(tmp_path, 2), patch_size=8, samples_per_epoch=4)
    dm = CASSIDataModule(train=train, val=SyntheticCubes(2, 8, 8, bands=3), batch_size=2,
                         simulator=Simulator(BernoulliMasks(), bands=3, backend="loop"))
    probe = Probe()
    L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, num_sanity_val_steps=0).fit(probe, dm)
    train_seen = [s for s in probe.seen if s[0] == "train"]
    assert [s[1] for s in train_seen] == [0, 0, 1, 1]
    assert all(s[3:] == ((2, 1, 8, 12), (2, 1, 8, 8)) for s in train_seen)
    assert not torch.equal(train_seen[0][2], train_seen[2][2])  # epoch 1 draws new crops
    val_seen = [s for s in probe.seen if s[0] == "val"]
    assert len(val_seen) == 4 and all(s[3:] == ((1, 1, 8, 12), (1, 1, 8, 8)) for s in val_seen)


class Pool(SyntheticCubes):
    """A training set with precomputed inputs (like ``FirstIterates``): counts its ``prepare()`` calls."""
    prepared = 0

    def prepare(self):
        self.prepared += 1


def test_only_fitting_prepares_the_training_set():
    """Evaluating a checkpoint must not run the solver over the training pool (minutes to hours)."""
    train = Pool(2, 8, 8, bands=3, seed=20)
    dm = CASSIDataModule(train=train, val=SyntheticCubes(2, 8, 8, bands=3), test=SyntheticCubes(1, 8, 8, bands=3, seed=9),
                         batch_size=2, simulator=Simulator(BernoulliMasks(), bands=3, backend="loop"))
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.validate(Probe(), dm)
    trainer.test(Probe(), dm)
    assert train.prepared == 0
    trainer.fit(Probe(), dm)
    assert train.prepared >= 1


def test_importing_cassi_data_stays_light():
    code = "import sys, cassi.data; assert 'lightning' not in sys.modules and 'hydra' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------- conf/data

def compose_data(name, *overrides):
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose(overrides=["+camera=synthetic", f"+data={name}", *overrides]).data  # a data config may choose another camera


def batch_of(dm, split):
    return dm.on_after_batch_transfer(next(iter(getattr(dm, f"{split}_dataloader")())), 0)


@pytest.mark.parametrize("name", sorted(p.stem for p in (CONF / "data").glob("*.yaml")))
def test_every_data_config_instantiates(name, tmp_path, request):
    overrides = []
    if name.startswith(("shared", "real", "measurements", "cave_train", "cave_real", "cave_val", "cave_refine")):
        overrides.append(f"+paths.shared_data={request.getfixturevalue('shared_data')}")
    if name in ("content_refine", "leaves", "photos"):  # generated scenes: stand-in content (tests/conftest.py)
        overrides += [f"+paths.content={request.getfixturevalue('content')}",
                      f"+paths.shared_data={request.getfixturevalue('shared_data')}"]
    if name in ("cave_refine", "content_refine", "cave_real", "synthetic_refine", "chart_refine"):  # GAP-TV's training reconstructions are kept in the run folder
        overrides.append(f"+paths.output_dir={tmp_path}")
    if name == "measurements":
        overrides += ["data.predict.entries=${paths.shared_data}/real/tsa_real_scene1.mat",
                      "data.predict.mask=${paths.shared_data}/masks/tsa_real_mask_660.mat"]
    if name == "folder":
        for i, split in enumerate(("train", "val", "test")):
            write_cubes(tmp_path / "cubes" / split, 2, offset=10 * i)
        overrides.append(f"+paths.data_dir={tmp_path}")
    if name == "cave_kaist":  # the published protocol's layout (data/README.md), in miniature
        for i, split in enumerate(("train", "val", "test")):
            write_cubes(tmp_path / "cave_kaist" / split, 2, offset=10 * i)
        scipy.io.savemat(tmp_path / "cave_kaist" / "mask_256.mat", {"mask": np.random.rand(12, 12)})
        overrides.append(f"+paths.data_dir={tmp_path}")
    dm = instantiate(compose_data(name, *overrides))
    assert isinstance(dm, CASSIDataModule)
    assert any(d is not None for d in dm.datasets.values())


def test_synthetic_config_batches():
    cfg = compose_data("synthetic", "data.train.n=4", "data.val.n=2", "data.test.n=1", "data.test.height=32",
                       "data.test.width=40", "data.batch_size=2", "data.simulator.backend=strided")
    dm = instantiate(cfg)
    for split, (b, h, w) in {"train": (2, 64, 64), "val": (1, 64, 64), "test": (1, 32, 40)}.items():
        batch = batch_of(dm, split)
        assert batch["x"].shape == (b, 28, h, w) and batch["x"].dtype == torch.float32
        assert batch["y"].shape == (b, 1, h, w + 54) and batch["mask"].shape == (b, 1, h, w)
        assert isinstance(batch["name"], list) and len(batch["name"]) == b


def test_measurement_files_skip_invalid_keeps_the_good_ones(shared_data, tmp_path):
    from cassi.data.datasets import MeasurementFiles

    (tmp_path / "broken.mat").write_bytes(b"MATLAB 5.0 MAT-file, truncated")
    good = shared_data / "real" / "tsa_real_scene2.mat"
    kw = dict(mask=shared_data / "masks" / "tsa_real_mask_660.mat", key="meas_real", bands=28, step=2)
    ds = MeasurementFiles([good, tmp_path / "broken.mat"], skip_invalid=True, **kw)
    assert [e["y"].name for e in ds.entries] == ["tsa_real_scene2.mat"]
    assert len(ds.skipped) == 1 and "broken.mat" in ds.skipped[0][0] and "broken.mat" in ds.skipped[0][1]
    assert ds[0]["y"].shape == (1, 660, 714)
    plain = MeasurementFiles([good, tmp_path / "broken.mat"], **kw)  # default: the bad file is an error
    with pytest.raises(ValueError, match="broken.mat"):
        [plain[i] for i in range(len(plain))]


def test_shared_configs_batches(shared_data):
    shared = f"+paths.shared_data={shared_data}"
    cave = instantiate(compose_data("shared_cave", shared, "data.simulator.backend=strided"))
    batch = batch_of(cave, "test")
    assert batch["name"] == ["cave_balloons_100"] and batch["x"].shape == (1, 28, 100, 100)
    assert batch["y"].shape == (1, 1, 100, 154)
    simu = io.load_mask(shared_data / "masks" / "tsa_simu_mask_256.mat")
    assert torch.equal(batch["mask"][0, 0], simu[78:178, 78:178])
    real = instantiate(compose_data("real", shared))
    batch = batch_of(real, "predict")
    assert batch["y"].shape == (1, 1, 660, 714) and batch["mask"].shape == (1, 1, 660, 660) and "x" not in batch
    assert batch["name"] == ["tsa_real_scene1"]
