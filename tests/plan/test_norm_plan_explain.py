"""rtcnorm.explain for the norms: the kernel key it names, its argument
errors, the loaded kernel on a GPU, and the rows the dense narrow
LayerNorm rule leaves alone."""

from __future__ import annotations

import pytest
import rtcnorm
import torch

BF16 = torch.bfloat16


@pytest.mark.parametrize(
    ("dtype", "m", "n", "kw"),
    [(BF16, 32768, 128, {}), (BF16, 16384, 256, {}), (BF16, 262144, 64, {}), (BF16, 65536, 192, {}),
     (BF16, 65536, 384, {}), (BF16, 65536, 512, {}), (BF16, 65536, 256, {"weight_dtype": torch.float32}),
     (BF16, 65536, 256, {"elementwise_affine": False}), (torch.float32, 65536, 256, {}),
     (BF16, 65536, 256, {"arch": "sm_100"})],
)  # fmt: skip
def test_dense_narrow_layer_norm_rule_leaves_other_rows(dtype, m, n, kw):
    """Outside the LayerNorm dense rule: grids under 12 CTAs an SM at two
    vectors (persistent at four), N = 64, uneven splits, rows past 384, float32
    gamma or rows, no affine tensor, and sm_100."""
    kw = {"sm_count": 132, "arch": "sm_90", **kw}
    plan = rtcnorm.explain("layer_norm", (m, n), dtype, **kw)
    assert not plan["kernel"].endswith(", 5>") and "1280 threads per SM" not in plan["reason"], plan


def test_explain_describes_mixed_dtypes_and_flags():
    plan = rtcnorm.explain("rms_norm", (64, 4096), torch.bfloat16, weight_dtype=torch.float32, device="cpu")
    assert plan["kernel"].startswith("rtcnorm::rms_norm_fwd<rtcnorm::bf16, float, 4096,")
    bare = rtcnorm.explain(
        "layer_norm", (64, 6, 8), torch.float16, normalized_shape=[6, 8], elementwise_affine=False, device="cpu"
    )
    assert bare["kernel"].startswith("rtcnorm::layer_norm_fwd<rtcnorm::fp16, rtcnorm::fp16, 48,")


def test_explain_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"mode must be None, 'static_persistent', 'multi_wave_reload' or"):
        rtcnorm.explain("rms_norm", (4, 64), mode="fast")
    with pytest.raises(ValueError, match=r"op must be one of \('rms_norm', 'layer_norm'\)"):
        rtcnorm.explain("group_norm", (4, 64))
    with pytest.raises(ValueError, match="normalized_shape"):
        rtcnorm.explain("layer_norm", (4, 64), normalized_shape=[32])


@pytest.mark.gpu
def test_explain_on_a_gpu_reports_the_loaded_kernel():
    plan = rtcnorm.explain("rms_norm", (8192, 4096), torch.bfloat16, mode="static_persistent")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    assert plan["sm_count"] == props.multi_processor_count
    assert plan["blocks_per_sm"] >= 1 and plan["registers"] > 0
    assert 1 <= plan["grid"] <= plan["sm_count"] * plan["blocks_per_sm"]
