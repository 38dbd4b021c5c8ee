"""Lightning modules and callbacks (the only part of cassi that imports Lightning)."""
from cassi.lightning.module import ReconstructionModule
from cassi.lightning.training import TrainingModule, warmup_cosine

__all__ = ["ReconstructionModule", "TrainingModule", "warmup_cosine"]
