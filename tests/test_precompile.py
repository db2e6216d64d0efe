"""Every RMSNorm / LayerNorm kernel variant compiles with NVRTC, with no GPU.

These sweeps compile thousands of kernels and are marked ``slow`` (run
them with ``--run-slow``): every flag, dtype and mode for one row length on
sm_90 (LayerNorm: bf16 only); every launch-plan class in float32, spread over
sm_80, sm_90 and sm_100; staged, column-CTA and cluster backwards on every
arch; the bf16 RMSNorm kernels of the automatic mode on sm_100 (sm_80's
run every time: precompile's flag coverage); and the full cross product of
row lengths, dtypes, modes and archs. Every run compiles one planned kernel
of each design for each dtype and arch instead
(test_compile_representatives.py).
"""

from __future__ import annotations

import re

import pytest
import rtcnorm
import torch

ARCHS = ("sm_80", "sm_90", "sm_100")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ALL_MODES = (None, *rtcnorm.MODES)
OPS = ("rms_norm", "layer_norm")

# Flag bits of kernels/common/params.cuh.
HAS_WEIGHT, HAS_BIAS, ZERO_CENTERED, RESIDUAL, CACHED_ROW, KEEP_GAMMA = 1, 2, 4, 8, 16, 32
GRAD_DH, WANT_DW, WANT_DB, SMEM_ROW, STAGED_ROW = 64, 128, 256, 4096, 1 << 16
CLUSTER_SHIFT = 14  # log2 of the CTAs of a thread-block cluster, in two bits
CLUSTER16 = 1 << 30  # ... or this bit alone: 16 CTAs (sm_90)
DEFER_STATS = 1 << 29  # backward: the cluster's row sums collected one row block late
COLUMN_GRADS = 1 << 21  # backward: column CTAs beside the row CTAs write dW / dB

_NORM = re.compile(
    r"^rtcnorm::(?P<kernel>\w+)<(?P<t>[\w:]+), (?P<w>[\w:]+), (?P<n>\d+), (?P<vec>\d+), (?P<tpr>\d+), "
    r"(?P<rows>\d+), (?P<nv>\d+), (?P<flags>\d+)u, (?P<minb>\d+)> (?P<target>\S+) (?P<how>compiled|cached)$"
)
_REDUCE = re.compile(r"^rtcnorm::column_reduce<(?P<w>[\w:]+), (?P<g>[14])> (?P<target>\S+) (?P<how>compiled|cached)$")
TYPE_NAMES = {torch.float32: "float", torch.float16: "rtcnorm::fp16", torch.bfloat16: "rtcnorm::bf16"}


def expected_target(arch: str) -> str:
    """A cubin for an arch NVRTC knows, else PTX for the newest older one."""
    number = int(arch.removeprefix("sm_"))
    known = rtcnorm.jit.nvrtc_info()["archs"]
    if number in known:
        return arch
    return f"compute_{max(a for a in known if a < number)}"


def parse(lines, arch):
    """Checks every line's form and target; returns the parsed norm kernels."""
    kernels = []
    for line in lines:
        m = _NORM.match(line) or _REDUCE.match(line)
        assert m, f"unexpected precompile line: {line!r}"
        assert m["target"] == expected_target(arch), line
        if "kernel" in m.groupdict():
            kernels.append({k: (int(v) if v.isdigit() else v) for k, v in m.groupdict().items()})
    return kernels


def compile_variants(op, ns, dtypes, modes, arch):
    lines = rtcnorm.jit.precompile(op, hidden_sizes=ns, dtypes=dtypes, modes=modes, archs=[arch])
    assert lines, "precompile returned no kernels"
    kernels = parse(lines, arch)
    norm_names = [ln.rsplit(" ", 2)[0] for ln in lines if not ln.startswith("rtcnorm::column_reduce<")]
    assert len(set(norm_names)) == len(norm_names), "a kernel was listed twice"
    reducers = [ln for ln in lines if ln.startswith("rtcnorm::column_reduce<")]
    # dW/dB reducers for the input dtype, and for float32 weights beside 16-bit input.
    # (Each thread of it reads 4 columns of rows of 16384+, a multiple of 4, else 1.)
    widths = {4 if n % 4 == 0 and n >= 16384 else 1 for n in ns}
    width = widths.pop() if len(widths) == 1 else None
    assert {ln.split(",")[0] for ln in reducers} == {
        f"rtcnorm::column_reduce<{TYPE_NAMES[w]}" for d in dtypes for w in {d, torch.float32}
    }
    assert width is None or all(f", {width}>" in ln for ln in reducers), reducers
    return kernels


def check_flag_coverage(op, kernels, dtypes):
    fwd = [k for k in kernels if k["kernel"] == f"{op}_fwd"]
    # Rows too long for registers run the split backward: a per-row coefficient
    # kernel (no gradient flags) and a column kernel carrying the flags.
    bwd = [k for k in kernels if k["kernel"] in (f"{op}_bwd", f"{op}_bwd_cols")]
    assert fwd and bwd
    if any(k["kernel"] == f"{op}_bwd_cols" for k in bwd):
        assert any(k["kernel"] == f"{op}_bwd_coef" for k in kernels)
    fwd_flags = {k["flags"] & (HAS_WEIGHT | HAS_BIAS | ZERO_CENTERED | RESIDUAL) for k in fwd}
    bwd_flags = {k["flags"] & (HAS_WEIGHT | ZERO_CENTERED | GRAD_DH | WANT_DW | WANT_DB) for k in bwd}
    if op == "rms_norm":
        assert fwd_flags == {0, HAS_WEIGHT, HAS_WEIGHT | ZERO_CENTERED} | {
            f | RESIDUAL for f in (0, HAS_WEIGHT, HAS_WEIGHT | ZERO_CENTERED)
        }
        assert {HAS_WEIGHT | WANT_DW, HAS_WEIGHT | WANT_DW | GRAD_DH, GRAD_DH, 0} <= bwd_flags
    else:
        assert {0, HAS_WEIGHT, HAS_BIAS, HAS_WEIGHT | HAS_BIAS, HAS_WEIGHT | HAS_BIAS | ZERO_CENTERED} <= fwd_flags
        assert not any(f & RESIDUAL for f in fwd_flags)
        assert {0, WANT_DW | HAS_WEIGHT, WANT_DB, WANT_DW | WANT_DB | HAS_WEIGHT} <= bwd_flags
    for d in dtypes:
        types = {(k["t"], k["w"]) for k in fwd if k["t"] == TYPE_NAMES[d]}
        assert types == {(TYPE_NAMES[d], TYPE_NAMES[w]) for w in {d, torch.float32}}, d


# LayerNorm shares the kernel bodies and the dtype handling with RMSNorm, so
# one 16-bit type (with its float32-weight twins) is enough for it here.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("op", "dtypes"), [("rms_norm", DTYPES), ("layer_norm", (torch.bfloat16,))], ids=["rms_norm", "layer_norm"]
)
def test_every_flag_dtype_and_mode_compiles_for_sm_90(op, dtypes):
    kernels = compile_variants(op, [4096], dtypes, ALL_MODES, "sm_90")
    check_flag_coverage(op, kernels, dtypes)
    fwd = [k for k in kernels if k["kernel"].endswith("_fwd")]
    # Rows held on chip and rows read twice (multi_wave_reload) are both there.
    assert any(k["flags"] & CACHED_ROW for k in fwd) and any(not k["flags"] & CACHED_ROW for k in fwd)
    # A call of a row count precompile samples finds its planned kernel
    # precompiled: one row, a few, a wave of 132 SMs at 1 and 4 rows a CTA,
    # and a full grid.
    lines = rtcnorm.jit.precompile(op, hidden_sizes=[4096], dtypes=dtypes, modes=[None], archs=["sm_90"])
    names = {ln.rsplit(" ", 2)[0] for ln in lines}
    for d in dtypes:
        for rows in (1, 2, 32, 132, 528, 65536):
            kernel = rtcnorm.explain(op, (rows, 4096), d, device="cpu", sm_count=132, arch="sm_90")["kernel"]
            assert kernel in names, (d, rows, kernel)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100"])
@pytest.mark.parametrize("op", OPS)
def test_column_grads_backward_compiles_on_every_arch(op, arch):
    """Grids of a few row blocks (32 rows) hand dW / dB to column CTAs in the
    same launch (kColumnGrads) on every arch: register rows of lone CTAs, with
    every gradient combination (and RMSNorm's dh), never staged, clustered or
    writing direct gradients."""
    kernels = compile_variants(op, [4096], [torch.bfloat16], [None], arch)
    cols = [k for k in kernels if k["kernel"] == f"{op}_bwd" and k["flags"] & COLUMN_GRADS]
    assert cols
    assert all(k["flags"] & CACHED_ROW and not k["flags"] & (STAGED_ROW | CLUSTER16 | DEFER_STATS) for k in cols)
    assert all((k["flags"] >> CLUSTER_SHIFT) & 3 == 0 and not k["flags"] & (1 << 23) for k in cols)
    grads = {k["flags"] & (WANT_DW | WANT_DB | GRAD_DH) for k in cols}
    if op == "rms_norm":
        assert grads == {WANT_DW, WANT_DW | GRAD_DH}
    else:
        assert grads == {WANT_DW, WANT_DB, WANT_DW | WANT_DB}


# sm_80 on every run: precompile's flag coverage (every weight, zero-centred,
# residual and gradient combination of bf16 RMSNorm) at CI cost.
@pytest.mark.parametrize("arch", ["sm_80", pytest.param("sm_100", marks=pytest.mark.slow)])
def test_bf16_kernels_compile_on_other_archs(arch):
    kernels = compile_variants("rms_norm", [4096], [torch.bfloat16], [None], arch)
    check_flag_coverage("rms_norm", kernels, [torch.bfloat16])


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", OPS)
def test_full_cross_product_compiles(op, arch):
    ns = [1, 7, 127, 128, 512, 1000, 3584, 4096, 4097, 5120, 7168, 8192, 16384, 32768, 65536, 131072, 262144]
    kernels = compile_variants(op, ns, DTYPES, ALL_MODES, arch)
    check_flag_coverage(op, kernels, DTYPES)


def test_precompile_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode must be None or one of"):
        rtcnorm.jit.precompile("rms_norm", hidden_sizes=[64], modes=["fastest"])
    with pytest.raises(ValueError, match=r"unknown op 'softmax_typo'.*layer_norm.*rms_norm"):
        rtcnorm.jit.precompile("softmax_typo", hidden_sizes=[64])
    with pytest.raises(ValueError, match="arch must look like 'sm_90'"):
        rtcnorm.jit.precompile("rms_norm", hidden_sizes=[64], archs=["hopper"])
    with pytest.raises(RuntimeError, match="sm_70 is not supported"):
        rtcnorm.jit.precompile("rms_norm", hidden_sizes=[64], dtypes=[torch.float32], archs=["sm_70"])
    with pytest.raises(ValueError, match=r"hidden_sizes must hold row lengths from 1 to 16777216 .*got 0$"):
        rtcnorm.jit.precompile("rms_norm", hidden_sizes=[0])
    with pytest.raises(ValueError, match=rf"hidden_sizes must hold row lengths .*got {2**63}$"):
        rtcnorm.jit.precompile("rms_norm", hidden_sizes=[2**63])
    with pytest.raises(ValueError, match=r"hidden_sizes must hold row lengths .*got 16777217$"):
        rtcnorm.jit.precompile("rms_norm", hidden_sizes=[2**24 + 1])
    with pytest.raises(TypeError, match=r"hidden_sizes must hold integers, got 8\.5$"):
        rtcnorm.jit.precompile("rms_norm", hidden_sizes=[8.5])
    with pytest.raises(TypeError, match=r"hidden_sizes must be an iterable of integers, got 4096$"):
        rtcnorm.jit.precompile("rms_norm", hidden_sizes=4096)
    with pytest.raises(TypeError, match=r"threads must be an integer \(0: one per CPU core\), got 2\.0$"):
        rtcnorm.jit.precompile("rms_norm", hidden_sizes=[64], threads=2.0)
    with pytest.raises(TypeError, match="dtype must be"):
        rtcnorm.jit.precompile("rms_norm", hidden_sizes=[64], dtypes=[torch.float64])


QUANTS = [("per_tensor", torch.float8_e4m3fn, "plain"), ("per_token", torch.float8_e5m2, "plain"),
          ("mxfp8", torch.float8_e4m3fn, "blocked"), ("nvfp4", torch.float4_e2m1fn_x2, "plain")]  # fmt: skip


def test_quantized_output_ops_are_precompile_variants():
    assert {"rms_norm_quant", "layer_norm_quant"} <= set(rtcnorm.jit._C.variant_ops())
    seen = []

    def stop(done, total):
        seen.append(total)
        raise KeyboardInterrupt  # the first compiled kernel is enough: wiring, not coverage

    with pytest.raises(KeyboardInterrupt):
        rtcnorm.jit.precompile("rms_norm_quant", hidden_sizes=[64], dtypes=[torch.bfloat16],
                               modes=["static_persistent"], archs=["sm_90"], threads=1, progress=stop)  # fmt: skip
    # Six recipes, MXFP8 and NVFP4 in both layouts: hundreds of forwards.
    assert seen and seen[0] > 100


@pytest.mark.slow
def test_precompiled_quantized_forwards_cover_the_sampled_row_counts():
    lines = rtcnorm.jit.precompile("layer_norm_quant", hidden_sizes=[256], dtypes=[torch.bfloat16],
                                   modes=["static_persistent"], archs=["sm_90"])  # fmt: skip
    names = {ln.rsplit(" ", 2)[0] for ln in lines}
    for recipe, out, layout in QUANTS:
        for rows in (1, 2, 32, 132, 528, 65536):
            plan = rtcnorm.explain("layer_norm", (rows, 256), torch.bfloat16, device="cpu", sm_count=132, arch="sm_90",
                                   mode="static_persistent", quant=recipe, quant_dtype=out, scale_layout=layout)  # fmt: skip
            assert plan["kernel"] in names, (recipe, layout, rows, plan["kernel"])
