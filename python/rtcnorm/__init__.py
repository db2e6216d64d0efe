"""rtcnorm: fused RMSNorm, LayerNorm and softmax ops for PyTorch.

CUDA kernels are compiled at run time with NVRTC for the exact dtype, row
length and launch configuration asked for, then cached in memory and on disk.
Importing rtcnorm needs no GPU, driver or CUDA toolkit.
"""

import torch  # noqa: F401  (libtorch must be loaded before the extension)

from . import _nvrtc_paths

_nvrtc_paths.register()

from . import _C, _ops, jit  # noqa: E402
from .functional import layer_norm, rms_norm  # noqa: E402
from .modes import MODES, explain  # noqa: E402
from .modules import LayerNorm, RMSNorm  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "MODES",
    "LayerNorm",
    "RMSNorm",
    "explain",
    "jit",
    "layer_norm",
    "rms_norm",
]

del _C, _ops
