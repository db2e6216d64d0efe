"""rtcnorm: fused RMSNorm, LayerNorm and softmax ops for PyTorch.

CUDA kernels are compiled at run time with NVRTC for the exact dtype, row
length and launch configuration asked for, then cached in memory and on disk.
Importing rtcnorm needs no GPU, driver or CUDA toolkit.
"""

import torch  # libtorch must be loaded before the extension

from . import _build_info, _nvrtc_paths

if torch.__version__.split("+")[0].split(".")[:2] != _build_info.TORCH_MAJOR_MINOR.split("."):
    raise ImportError(
        f"rtcnorm was built against torch {_build_info.TORCH_VERSION} and links against that libtorch, "
        f"but torch {torch.__version__} is imported: install torch {_build_info.TORCH_MAJOR_MINOR}.x "
        "or rebuild rtcnorm against this torch (make build, or pip install --no-build-isolation .)"
    )

_nvrtc_paths.register()

from . import _C, _ops, _softmax_ops, distributed, jit, softmax, tuned_table  # noqa: E402  (distributed: DTensor rules, lazily)
from .functional import layer_norm, rms_norm  # noqa: E402
from .gated import rms_norm_gated  # noqa: E402
from .modes import MODES, explain  # noqa: E402
from .modules import LayerNorm, RMSNorm, RMSNormGated  # noqa: E402
from .patch import PatchSummary, patch, patched, unpatch  # noqa: E402
from .quantized import Quant, QuantizedTensor  # noqa: E402
from .softmax import (  # noqa: E402
    FusedScaleMaskSoftmax,
    scaled_aligned_causal_masked_softmax,
    scaled_masked_softmax,
    scaled_softmax,
    scaled_upper_triang_masked_softmax,
)
from .tuning import tune  # noqa: E402

__version__ = "0.1.0"
tuned_table.install()  # the shipped tuning tables, read when CUDA initializes

__all__ = [
    "MODES",
    "PatchSummary",
    "Quant",
    "QuantizedTensor",
    "FusedScaleMaskSoftmax",
    "LayerNorm",
    "RMSNorm",
    "RMSNormGated",
    "distributed",
    "explain",
    "jit",
    "layer_norm",
    "patch",
    "patched",
    "quantized",
    "rms_norm",
    "rms_norm_gated",
    "scaled_aligned_causal_masked_softmax",
    "scaled_masked_softmax",
    "scaled_softmax",
    "scaled_upper_triang_masked_softmax",
    "softmax",
    "tune",
    "unpatch",
]

del _C, _ops, _softmax_ops
