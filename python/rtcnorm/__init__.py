"""rtcnorm: fused RMSNorm, LayerNorm and softmax ops for PyTorch.

CUDA kernels are compiled at run time with NVRTC for the exact dtype, row
length and launch configuration asked for, then cached in memory and on disk.
Importing rtcnorm needs no GPU, driver or CUDA toolkit.
"""

import torch  # noqa: F401  (libtorch must be loaded before the extension)

from . import _nvrtc_paths

_nvrtc_paths.register()

from . import _C, _ops, _softmax_ops, distributed, jit, softmax  # noqa: E402  (distributed: DTensor rules, lazily)
from .functional import layer_norm, rms_norm  # noqa: E402
from .modes import MODES, explain  # noqa: E402
from .modules import LayerNorm, RMSNorm  # noqa: E402
from .patch import PatchSummary, patch, patched, unpatch  # noqa: E402
from .softmax import (  # noqa: E402
    FusedScaleMaskSoftmax,
    scaled_aligned_causal_masked_softmax,
    scaled_masked_softmax,
    scaled_softmax,
    scaled_upper_triang_masked_softmax,
)

__version__ = "0.1.0"

__all__ = [
    "MODES",
    "PatchSummary",
    "FusedScaleMaskSoftmax",
    "LayerNorm",
    "RMSNorm",
    "distributed",
    "explain",
    "jit",
    "layer_norm",
    "patch",
    "patched",
    "rms_norm",
    "scaled_aligned_causal_masked_softmax",
    "scaled_masked_softmax",
    "scaled_softmax",
    "scaled_upper_triang_masked_softmax",
    "softmax",
    "unpatch",
]

del _C, _ops, _softmax_ops
