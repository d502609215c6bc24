"""Loading the bundled target and drafter, and the library code of the training scripts."""

from .bundled import BUNDLED_DRAFTER, BUNDLED_HEAD, TEMPLATES_HEAD, load_speculator
from ..decoding.loading import BUNDLED_TARGET, load_target

__all__ = ["BUNDLED_DRAFTER", "BUNDLED_HEAD", "TEMPLATES_HEAD", "BUNDLED_TARGET", "load_speculator", "load_target"]
