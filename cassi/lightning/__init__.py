"""Lightning modules and callbacks (the only part of cassi that imports Lightning)."""
from cassi.lightning.datamodule import CASSIDataModule
from cassi.lightning.module import ReconstructionModule
from cassi.lightning.training import TrainingModule, warmup_cosine

__all__ = ["CASSIDataModule", "ReconstructionModule", "TrainingModule", "warmup_cosine"]
