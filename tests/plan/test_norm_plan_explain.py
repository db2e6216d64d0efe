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


# Recipe codes and the blocked-scales bit of the kernel's flag word
# (kernels/common/quant_math.cuh, params.cuh: kQuantBits at bit 25).
QUANT_FLAGS = {("per_tensor", None): 1, ("per_tensor", torch.float8_e5m2): 2, ("per_token", None): 3,
               ("mxfp8", None): 5, ("nvfp4", None): 6}  # fmt: skip


@pytest.mark.parametrize(("recipe", "qdtype"), list(QUANT_FLAGS))
@pytest.mark.parametrize(("op", "shape"), [("rms_norm", (4, 131072)), ("layer_norm", (4096, 33)), ("rms_norm", (1, 7))])
def test_explain_plans_a_quantized_output_on_unsliced_rows(recipe, qdtype, op, shape):
    """A quantized forward names its recipe in the kernel's flags and never
    takes sliced rows, even for few long rows where the plain forward does;
    the backward plan is the plain one's."""
    plain = rtcnorm.explain(op, shape)
    for layout in ("plain", "blocked") if recipe in ("mxfp8", "nvfp4") else ("plain",):
        plan = rtcnorm.explain(op, shape, quant=recipe, quant_dtype=qdtype, scale_layout=layout)
        flags = int(plan["kernel"].split(", ")[-2].rstrip("u"))
        assert (flags >> 25) & 7 == QUANT_FLAGS[(recipe, qdtype)], plan["kernel"]
        assert bool(flags >> 28 & 1) == (layout == "blocked"), plan["kernel"]
        assert plan["design"] != "sliced_row" and plan["column_slices"] == 1, plan
        assert plan["backward"]["kernel"] == plain["backward"]["kernel"]


def test_explain_refuses_bad_quant_arguments_as_the_op_does():
    with pytest.raises(ValueError, match=r"rtcnorm\.norm_quant: recipe must be one of .*got 'int8'"):
        rtcnorm.explain("rms_norm", (4, 64), quant="int8")
    with pytest.raises(ValueError, match=r"rtcnorm\.norm_quant: out_dtype must be torch\.float8_e4m3fn for recipe"):
        rtcnorm.explain("rms_norm", (4, 64), quant="mxfp8", quant_dtype=torch.float8_e5m2)
    with pytest.raises(ValueError, match=r"rtcnorm\.norm_quant: scale_layout 'blocked' is for the block recipes"):
        rtcnorm.explain("layer_norm", (4, 64), quant="per_token", scale_layout="blocked")


@pytest.mark.parametrize(("recipe", "qdtype"), list(QUANT_FLAGS))
@pytest.mark.parametrize(("m", "n"), [(4096, 9999), (38177, 1973)])
def test_odd_16_bit_rows_quantize_from_flat_rows(recipe, qdtype, m, n):
    """Many contiguous 16-bit rows of odd width stage as flat rows for a
    quantized output as for a plain one: the register rows' one-element
    loads leave too little in flight (docs/designs.md)."""
    for dtype in (torch.bfloat16, torch.float16):
        plan = rtcnorm.explain("rms_norm", (m, n), dtype, device="cpu", quant=recipe, quant_dtype=qdtype)
        assert plan["design"] == "flat_row", plan["reason"]
        assert rtcnorm.explain("rms_norm", (m, n), dtype, device="cpu")["design"] == "flat_row"


@pytest.mark.parametrize(
    ("op", "m", "n"), [("layer_norm", 16384, 5120), ("rms_norm", 16384, 5120), ("layer_norm", 16384, 8192)]
)
def test_a_layout_two_cta_sizes_share_is_ranked_once(op, m, n):
    """A row of 160 or 256 threads makes a CTA of one row at both 128 and 256
    threads: one layout, a candidate once. Repeats had taken half the six
    ranked places, which tune() times."""
    plan = rtcnorm.explain(op, (m, n), BF16, device="cpu", arch="sm_90", sm_count=132)["backward"]
    ranked = [repr((c["design"], sorted(c["knobs"].items()))) for c in plan["candidates"]]
    assert len(ranked) == len(set(ranked)) == 6, ranked


# Problems whose catalogue reaches one kernel and launch from several layouts
# or vector-count targets: shared-memory rows of 1024 threads from every
# target (a residual beside 112459 columns), one vector a thread on 864
# threads from two targets (24764x6912 backward).
REACHED_TWICE = [
    ("rms_norm", (1416, 112459), {"residual": True}, "fwd"),
    ("layer_norm", (94, 45056), {}, "fwd"),
    ("rms_norm", (24764, 6912), {}, "bwd"),
    ("rms_norm", (920, 55296), {}, "bwd"),
]


@pytest.mark.parametrize(
    ("op", "shape", "kw", "phase"), REACHED_TWICE, ids=[f"{o}-{s[0]}x{s[1]}-{p}" for o, s, _, p in REACHED_TWICE]
)
def test_a_kernel_and_launch_reached_twice_is_one_candidate(op, shape, kw, phase):
    plan = rtcnorm.explain(op, shape, BF16, device="cpu", arch="sm_90", sm_count=132, **kw)
    plan = plan if phase == "fwd" else plan["backward"]
    fields = ("design", "knobs", "us", "bytes", "registers", "grid")
    ranked = [repr([sorted(c[f].items()) if f == "knobs" else c[f] for f in fields]) for c in plan["candidates"]]
    assert len(ranked) == len(set(ranked)), ranked
    assert plan["candidates"][0]["design"] == plan["design"]
