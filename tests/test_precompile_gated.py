"""rtcnorm.jit.precompile and ``rtcnorm precompile`` for the gated RMSNorm
ops (no GPU): ``rms_norm_gated`` (forward, backward with and without dW, the
dW column reduce) and ``rms_norm_gated_quant`` (the forward of every recipe
and scale layout) compile with NVRTC for sm_80, sm_90 and sm_100, and the
precompiled kernels are exactly those the launch path's planner
(``_C._gated_plan``, i.e. gated_key) picks for every call of that width and
group size. The GPU file test_rms_norm_gated_quant_gpu.py checks that real
calls then compile nothing."""

from __future__ import annotations

import re

import pytest
import rtcnorm
import torch
from quant_checks import RECIPES
from rtcnorm import _C, cli
from test_precompile import TYPE_NAMES, expected_target
from test_rms_norm_gated_quant import quant_flags

GATED_OPS = ("rms_norm_gated", "rms_norm_gated_quant")
DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
WANT_DW = 8  # kernels/norm/gated_params.cuh kGatedWantDw
_GATED = re.compile(
    r"^rtcnorm::rms_norm_gated_(?P<dir>fwd|bwd)<[\w:]+, [\w:]+, (?P<n>\d+), (?P<g>\d+), \d+, \d+, \d+, \d+, "
    r"(?P<flags>\d+)u>$"
)
_REDUCE = re.compile(r"^rtcnorm::column_reduce<[\w:]+, [14]>$")


def precompile(op, ns, dtypes, arch, groups=(None,)):
    """The precompiled kernels' names, after checking each line's target."""
    lines = rtcnorm.jit.precompile(op, hidden_sizes=ns, dtypes=dtypes, archs=[arch], group_sizes=groups)
    names = []
    for line in lines:
        name, target, how = line.rsplit(" ", 2)
        assert target == expected_target(arch) and how in ("compiled", "cached"), line
        assert _GATED.match(name) or (op == "rms_norm_gated" and _REDUCE.match(name)), line
        names.append(name)
    assert len(names) == len(set(names)), "a kernel was listed twice"
    return set(names)


def planned(op, dtype, n, group, arch):
    """The kernels calls of every weight (none, input's dtype, float32), gate
    order and activation launch, as the planner names them; the backward's
    flags with and without dW, and the dW column reduce (its threads take 4
    columns of a row of 16384+ that is a multiple of 4, else 1)."""
    name = DTYPE_NAMES[dtype]
    wdtypes = [None, dtype] + ([torch.float32] if dtype != torch.float32 else [])
    quants = [quant_flags(*r) for r in RECIPES]
    assert len(set(quants)) == 8  # four FP8 recipes, MXFP8 and NVFP4 in both layouts
    want = set()
    for wd in wdtypes:
        for order in (True, False):
            for sigmoid in (False, True):
                args = (name, DTYPE_NAMES[wd or dtype], n, group, wd is not None, order, sigmoid, arch)
                if op == "rms_norm_gated_quant":
                    for q in quants:
                        fwd = _C._gated_plan(*args, quant=q)["forward"]
                        if fwd is not None:
                            want.add(fwd["kernel"])
                    continue
                plan = _C._gated_plan(*args)
                if plan["forward"] is not None:
                    want.add(plan["forward"]["kernel"])
                bwd = plan["backward"]
                if bwd is None:
                    continue
                want.add(bwd["kernel"])
                if wd is not None:
                    head, flags = bwd["kernel"].rsplit(", ", 1)
                    want.add(f"{head}, {int(flags.rstrip('u>')) & ~WANT_DW}u>")
                    width = 4 if n % 4 == 0 and n >= 16384 else 1
                    want.add(f"rtcnorm::column_reduce<{TYPE_NAMES[wd]}, {width}>")
    return want


def test_gated_ops_are_precompile_variants():
    assert set(GATED_OPS) <= set(_C.variant_ops())


# Per arch, bf16: both ops at an odd width (one-element vectors, partial last
# MXFP8 / NVFP4 blocks) or at one of whole 32-blocks, the gated op at the
# other too, and on sm_90 in groups of 1024: about 30 s for the three archs
# on two cores (the quantized op's 96 forwards a width dominate). The slow
# test below takes every dtype, more widths and groups.
CI_CASES = {"sm_80": (33, 4096, ()), "sm_90": (4096, 33, (1024,)), "sm_100": (33, 4096, ())}


@pytest.mark.parametrize("arch", list(CI_CASES))
def test_gated_variants_compile_for_each_arch(arch):
    both, other, groups = CI_CASES[arch]
    got = precompile("rms_norm_gated", [both, other], [torch.bfloat16], arch)
    if groups:
        got |= precompile("rms_norm_gated", [4096], [torch.bfloat16], arch, groups=groups)
    got_q = precompile("rms_norm_gated_quant", [both], [torch.bfloat16], arch)
    number = int(arch.removeprefix("sm_"))
    want = planned("rms_norm_gated", torch.bfloat16, both, both, number)
    want |= planned("rms_norm_gated", torch.bfloat16, other, other, number)
    for g in groups:
        want |= planned("rms_norm_gated", torch.bfloat16, 4096, g, number)
    assert got == want
    assert got_q == planned("rms_norm_gated_quant", torch.bfloat16, both, both, number)
    # Both gate orders, both activations, weightless and both weight dtypes, dW or not.
    flags = {int(_GATED.match(k)["flags"]) & 15 for k in got if k.startswith("rtcnorm::rms_norm_gated_bwd")}
    assert flags == {0, 2, 4, 6, 1, 3, 5, 7, 9, 11, 13, 15}
    assert {k.split(", ")[1] for k in got if k.startswith("rtcnorm::rms_norm_gated_fwd")} == {"rtcnorm::bf16", "float"}


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(CI_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_every_dtype_width_and_group_compiles(arch, dtype):
    """Widths and groups where the quantized op's plans refuse recipes
    (MXFP8 blocks straddling groups of 25 or 16, per-token rows of 17
    groups) or take them all."""
    number = int(arch.removeprefix("sm_"))
    for n, groups in ((7, (None,)), (50, (None, 25)), (272, (16,)), (4096, (None, 1024)), (4097, (None,))):
        for op in GATED_OPS:
            got = precompile(op, [n], [dtype], arch, groups=groups)
            want = set().union(*(planned(op, dtype, n, g or n, number) for g in groups))
            assert got == want, (op, n, groups)


def test_precompile_skips_recipes_the_op_does_not_plan():
    # Groups of 25 split MXFP8 / NVFP4 blocks: those calls run the composite
    # path, so precompile lists only the FP8 recipes' forwards.
    got = precompile("rms_norm_gated_quant", [50], [torch.float32], "sm_90", groups=[25])
    assert got and got == planned("rms_norm_gated_quant", torch.float32, 50, 25, 90)
    recipes = {int(_GATED.match(k)["flags"]) >> 25 & 7 for k in got}
    assert recipes == {1, 2, 3, 4}


def test_bad_group_sizes_name_the_argument():
    kw = dict(hidden_sizes=[100], dtypes=[torch.bfloat16], archs=["sm_90"])
    with pytest.raises(ValueError, match=r"group_sizes is taken only by .*\(rms_norm_gated, rms_norm_gated_quant\), "
                                         r"not by 'rms_norm'$"):  # fmt: skip
        rtcnorm.jit.precompile("rms_norm", group_sizes=[10], **kw)
    with pytest.raises(ValueError, match=r"group_sizes must hold divisors of every hidden size, got group size 3 "
                                         r"for hidden size 100$"):  # fmt: skip
        rtcnorm.jit.precompile("rms_norm_gated", group_sizes=[3], **kw)
    with pytest.raises(ValueError, match=r"group_sizes must hold positive integers or None, got 0$"):
        rtcnorm.jit.precompile("rms_norm_gated", group_sizes=[0], **kw)
    with pytest.raises(TypeError, match=r"group_sizes must hold integers or None, got 2\.5$"):
        rtcnorm.jit.precompile("rms_norm_gated", group_sizes=[2.5], **kw)
    with pytest.raises(TypeError, match=r"group_sizes must be an iterable of integers or None, got 64$"):
        rtcnorm.jit.precompile("rms_norm_gated_quant", group_sizes=64, **kw)


def test_cli_precompiles_gated_group_sizes(capsys):
    argv = ["precompile", "--ops", "rms_norm_gated", "--hidden-sizes", "64", "--group-sizes", "N", "16"]
    argv += ["--dtypes", "fp32", "--archs", "sm_90", "-q"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    want = planned("rms_norm_gated", torch.float32, 64, 64, 90) | planned("rms_norm_gated", torch.float32, 64, 16, 90)
    assert out.startswith(f"{len(want)} kernels ("), out
    with pytest.raises(SystemExit) as e:
        cli.main(["precompile", "--ops", "rms_norm_gated", "--hidden-sizes", "64", "--group-sizes", "0"])
    assert e.value.code == 2
    assert "expected a positive integer or N (one group a row), got '0'" in capsys.readouterr().err
