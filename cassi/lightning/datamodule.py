"""The LightningDataModule: train/val/test/predict datasets, seeded loaders, measurements simulated on device.

Batches are dicts (see ``cassi.data.datasets``): "x" (B, C, H, W), "y" (B, 1, H, W+Δ),
"mask" (B, 1|C, H, W), "name" list[str]. Batches with "x" but no "y" get
y = noise(A x) from the ``Simulator`` in ``on_after_batch_transfer``, i.e. on the
model's device.
"""
from __future__ import annotations

import itertools
import random

import lightning as L
import numpy as np
import torch
from lightning.pytorch.trainer.states import TrainerFn
from torch.utils.data import ConcatDataset, DataLoader, Dataset, DistributedSampler

from cassi.data.datasets import collate, stable_seed
from cassi.physics.simulate import Simulator

__all__ = ["CASSIDataModule", "EpochSampler", "check_disjoint", "seed_worker"]

SPLITS = ("train", "val", "test", "predict")


def seed_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: seed numpy and random from the worker's torch seed
    (which the loader derives from its seeded generator and the worker id)."""
    s = torch.initial_seed() % 2**32
    np.random.seed(s)
    random.seed(s)


def _parts(ds) -> list:
    return [p for d in ds.datasets for p in _parts(d)] if isinstance(ds, ConcatDataset) else [ds]


def _shared(a, b) -> list[str]:
    """What two datasets share: the same object, common files, or overlapping synthetic seeds."""
    if a is b:
        return ["the same dataset object"]
    sa, sb = getattr(a, "seeds", None), getattr(b, "seeds", None)
    if isinstance(sa, range) and isinstance(sb, range):
        lo, hi = max(sa.start, sb.start), min(sa.stop, sb.stop)
        return [f"synthetic seeds {lo}..{hi - 1}"] if lo < hi else []
    fa, fb = getattr(a, "files", None), getattr(b, "files", None)
    return sorted(map(str, set(fa) & set(fb))) if fa is not None and fb is not None else []


def check_disjoint(splits: dict[str, Dataset | None]) -> None:
    """Raise ValueError when two splits share a file (resolved paths) or a synthetic seed.

    Datasets are compared through ConcatDataset; others without ``files`` / ``seeds``
    (e.g. a Subset) are only compared by identity.
    """
    given = [(k, d) for k, d in splits.items() if d is not None]
    for (ka, da), (kb, db) in itertools.combinations(given, 2):
        shared = [s for a in _parts(da) for b in _parts(db) for s in _shared(a, b)]
        if shared:
            raise ValueError(f"splits {ka!r} and {kb!r} overlap ({len(shared)} shared: {shared[:3]}): "
                             f"validation/test data must not be trained or tuned on")


class EpochSampler(DistributedSampler):
    """Shuffled indices from a generator seeded with (seed + epoch), one shard per rank
    (one shard without DDP). ``set_epoch``, which Lightning calls every epoch before the
    workers start, also reaches the dataset, so random crops change every epoch."""

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        for part in _parts(self.dataset):
            if callable(getattr(part, "set_epoch", None)):
                part.set_epoch(epoch)


class CASSIDataModule(L.LightningDataModule):
    """Datasets for every stage plus the measurement simulator.

    Args:
        train, val, test, predict: torch Datasets of sample dicts (any may be None);
            train/val/test must not share files or synthetic seeds (predict may,
            e.g. to reconstruct the test scenes): ValueError otherwise.
        simulator: makes "mask" and "y" for batches with ground truth only (None: the
            datasets must provide "y" and "mask").
        batch_size: training batch size; eval_batch_size: for val/test/predict.
        num_workers, pin_memory: as for DataLoader (workers are not persistent, so that
            each epoch's workers see the dataset's new epoch).
        seed: the train order (epoch e is shuffled with seed + e), the workers' seeds
            (numpy/random/torch), and the eval masks/noise.

    Training simulates with a generator seeded from (seed, epoch, global step, the batch's
    sample names), so a run resumed from a checkpoint sees the same measurements; evaluation
    from (seed, the sample names), so val/test measurements are the same every epoch and run.
    """

    def __init__(self, train: Dataset | None = None, val: Dataset | None = None, test: Dataset | None = None,
                 predict: Dataset | None = None, simulator: Simulator | None = None, batch_size: int = 4,
                 eval_batch_size: int = 1, num_workers: int = 0, seed: int = 0, pin_memory: bool = False):
        super().__init__()
        self.datasets = {"train": train, "val": val, "test": test, "predict": predict}
        check_disjoint({k: self.datasets[k] for k in ("train", "val", "test")})
        self.simulator = simulator
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.num_workers, self.seed, self.pin_memory = num_workers, seed, pin_memory

    def prepare_data(self) -> None:
        """On one process per node (Lightning calls it there first), when fitting: training datasets with a
        ``prepare()`` (precomputed inputs, e.g. ``cassi.data.FirstIterates``) compute and cache them, so that
        under DDP the other ranks load the cache in :meth:`setup` instead of each running the solver.
        ``validate``/``test``/``predict`` leave them alone (they never read the training split)."""
        if self.trainer is None or self.trainer.state.fn == TrainerFn.FITTING:
            self._prepare()

    def setup(self, stage: str | None = None) -> None:
        """Before fitting, training datasets with a ``prepare()`` compute (or load) them here, in the main
        process, so that data-loader workers share them."""
        if stage in (None, "fit"):
            self._prepare()

    def _prepare(self) -> None:
        for part in _parts(self.datasets["train"]) if self.datasets["train"] is not None else []:
            if callable(getattr(part, "prepare", None)):
                part.prepare()

    def _loader(self, split: str, batch_size: int, sampler=None) -> DataLoader | list:
        ds = self.datasets[split]
        if ds is None:
            return []  # Lightning skips a stage without batches
        # collate: samples that failed to load (MeasurementFiles(skip_invalid=True)) go to batch["failed"]
        return DataLoader(ds, batch_size=batch_size, sampler=sampler, num_workers=self.num_workers,
                          pin_memory=self.pin_memory, worker_init_fn=seed_worker, collate_fn=collate,
                          generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self):
        ds, t = self.datasets["train"], self.trainer
        replicas, rank = (t.world_size, t.global_rank) if t is not None else (1, 0)
        sampler = None if ds is None else EpochSampler(ds, replicas, rank, shuffle=True, seed=self.seed)
        return self._loader("train", self.batch_size, sampler)

    def val_dataloader(self):
        return self._loader("val", self.eval_batch_size)

    def test_dataloader(self):
        return self._loader("test", self.eval_batch_size)

    def predict_dataloader(self):
        return self._loader("predict", self.eval_batch_size)

    def on_after_batch_transfer(self, batch, dataloader_idx: int = 0):
        """Simulate "mask" and "y" on the batch's device when it has "x" but no "y" (nor a model input
        "x0" of its own, as ``cassi.data.FirstIterates`` windows have)."""
        if not isinstance(batch, dict) or "x" not in batch or "y" in batch or "x0" in batch:
            return batch
        if self.simulator is None:
            raise ValueError("the batch has ground truth 'x' but no measurement 'y', and no simulator is configured")
        training = self.trainer is not None and self.trainer.training
        names = batch.get("name") or []
        # training masks/noise drawn from (seed, epoch, step, names): a resumed run sees the same batches
        where = ("train", self.trainer.current_epoch, self.trainer.global_step) if training else ()
        gen = torch.Generator().manual_seed(stable_seed(self.seed, *where, *names))
        return self.simulator(batch, generator=gen, training=training)
