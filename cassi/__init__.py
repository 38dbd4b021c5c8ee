"""cassi: coded aperture snapshot spectral imaging.

Importing this package pulls in torch only (no Lightning, no Hydra), and caps torch's threads at this process's
share of the cores (``cassi.threads``).
"""
from cassi import threads as _threads
from cassi.physics.operator import CASSI
from cassi.registry import register

_threads.cap()

__all__ = ["CASSI", "register"]
__version__ = "0.1.0"
