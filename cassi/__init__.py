"""cassi: coded aperture snapshot spectral imaging.

Importing this package pulls in torch only (no Lightning, no Hydra).
"""
from cassi.operator import CASSI
from cassi.registry import register

__all__ = ["CASSI", "register"]
__version__ = "0.1.0"
