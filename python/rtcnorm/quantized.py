"""Quantized norm outputs: the ``quant=`` recipe and the tensor that holds them.

``Quant`` names a recipe (docs/quantized_outputs.md); ``QuantizedTensor`` is
what ``rtcnorm.rms_norm(..., quant=q)`` and ``rtcnorm.layer_norm(..., quant=q)``
return. It looks like the unquantized output (input's dtype and shape) and
holds only the quantized data and its scales. Any op but the few handled
below sees it as its dequantized dense value, so ``F.linear(qt, w)`` runs and
gradients come back as dense tensors of input's dtype.

Invariants:
- Every scale stored here is a DEQUANT multiplier (y ~= float(q) * scale),
  except nvfp4's ``global_scale``, the ENCODE scale gs (y ~= float(q) * S / gs).
- Rows are the leading dims flattened, ``n`` the normalized width; data and
  scales are row-major over (rows, n) as norm_quant writes them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import torch
from torch.utils._pytree import tree_map_only

# recipe -> the output dtypes it allows, the first being the default.
RECIPE_DTYPES = {
    "per_tensor": (torch.float8_e4m3fn, torch.float8_e5m2),
    "per_token": (torch.float8_e4m3fn, torch.float8_e5m2),
    "mxfp8": (torch.float8_e4m3fn,),
    "nvfp4": (torch.float4_e2m1fn_x2,),
}
SCALED_RECIPES = frozenset({"per_tensor", "nvfp4"})  # a given scale is required
BLOCK_SIZE = {"mxfp8": 32, "nvfp4": 16}  # elements along n sharing a scale
BLOCK_SCALE_DTYPE = {"mxfp8": torch.float8_e8m0fnu, "nvfp4": torch.float8_e4m3fn}
LAYOUTS = ("plain", "blocked")


def _names(values) -> str:
    return ", ".join(repr(v) for v in values)


def _dtype_names(dtypes) -> str:
    return ", ".join(str(d) for d in dtypes)


@dataclasses.dataclass(frozen=True)
class Quant:
    """How a norm's output is quantized: ``rtcnorm.rms_norm(x, n, w, quant=Quant(...))``.

    Args:
        recipe: "per_tensor" (FP8, a given scale), "per_token" (FP8, one scale
            per row from its amax), "mxfp8" (E4M3 data, one E8M0 scale per 32
            elements of a row) or "nvfp4" (packed E2M1, one E4M3 scale per 16
            elements, plus a given fp32 global scale).
        dtype: the data's dtype; None means the recipe's first allowed one
            (float8_e4m3fn; float4_e2m1fn_x2 for nvfp4). per_tensor and
            per_token also take float8_e5m2.
        scale: per_tensor's QUANTIZE multiplier (q = y * scale) or nvfp4's
            global encode scale; a float or a one-element float32 tensor,
            best on the input's device (a tensor may be updated in place
            between calls, for delayed scaling; a CPU one costs per_tensor
            a blocking copy on CUDA). Required for per_tensor and nvfp4,
            refused otherwise.
        layout: of the block scales, "plain" (rows x blocks, row-major) or
            "blocked" (the 128x4-tile layout torch._scaled_mm and cuBLAS take;
            mxfp8 and nvfp4 only).
    """

    recipe: str
    dtype: torch.dtype | None = None
    scale: torch.Tensor | float | None = None
    layout: str = "plain"

    def __post_init__(self):
        if not isinstance(self.recipe, str) or self.recipe not in RECIPE_DTYPES:
            raise ValueError(f"rtcnorm.Quant: recipe must be one of {_names(RECIPE_DTYPES)}, got {self.recipe!r}")
        allowed = RECIPE_DTYPES[self.recipe]
        if self.dtype is None:
            object.__setattr__(self, "dtype", allowed[0])
        elif self.dtype not in allowed:
            raise ValueError(
                f"rtcnorm.Quant: dtype for recipe {self.recipe!r} must be one of {_dtype_names(allowed)}, "
                f"got {self.dtype!r}"
            )
        self._check_scale()
        if not isinstance(self.layout, str) or self.layout not in LAYOUTS:
            raise ValueError(f"rtcnorm.Quant: layout must be one of {_names(LAYOUTS)}, got {self.layout!r}")
        if self.layout == "blocked" and self.recipe not in BLOCK_SIZE:
            raise ValueError(
                f"rtcnorm.Quant: layout 'blocked' is only for recipes {_names(BLOCK_SIZE)}, "
                f"not {self.recipe!r}; use layout='plain'"
            )

    def _check_scale(self):
        s, recipe = self.scale, self.recipe
        if s is None:
            if recipe in SCALED_RECIPES:
                raise ValueError(f"rtcnorm.Quant: scale is required for recipe {recipe!r}")
            return
        if recipe not in SCALED_RECIPES:
            raise ValueError(
                f"rtcnorm.Quant: scale must be None for recipe {recipe!r} (only {_names(sorted(SCALED_RECIPES))} "
                "take one)"
            )
        if isinstance(s, torch.Tensor):
            if s.dtype != torch.float32 or s.numel() != 1:
                raise ValueError(
                    "rtcnorm.Quant: scale must be a one-element float32 tensor or a float, "
                    f"got a tensor of dtype {s.dtype} and shape {tuple(s.shape)}"
                )
            return
        if isinstance(s, bool) or not isinstance(s, numbers.Real):
            raise TypeError(f"rtcnorm.Quant: scale must be a float or a one-element float32 tensor, got {s!r}")
        if not (math.isfinite(s) and s > 0):
            raise ValueError(f"rtcnorm.Quant: scale must be finite and > 0, got {s!r}")

    def scale_tensor(self, device=None) -> torch.Tensor | None:
        """The scale as norm_quant takes it: a float32 tensor. A float becomes
        a one-element tensor filled on ``device`` (input's): a CPU scale would
        cost the op a blocking host-to-device copy for per_tensor."""
        s = self.scale
        if s is None or isinstance(s, torch.Tensor):
            return s
        return torch.full((1,), float(s), dtype=torch.float32, device=device)


def _ceil_div(a, b):
    return (a + b - 1) // b


def blocked_scales(plain: torch.Tensor) -> torch.Tensor:
    """Block scales (rows, blocks) rearranged into the 1-D blocked layout:
    the matrix padded with zeros to (round_up(rows, 128), round_up(blocks, 4))
    and cut into 128x4 tiles, tiles row-major; entry (r, c) of a tile at
    byte (r % 32) * 16 + (r // 32) * 4 + c."""
    rows, blocks = plain.shape
    rt, ct = _ceil_div(rows, 128), _ceil_div(blocks, 4)
    b = plain.view(torch.uint8)
    padded = b.new_zeros((rt * 128, ct * 4))
    padded[:rows, :blocks] = b
    tiles = padded.view(rt, 4, 32, ct, 4).permute(0, 3, 2, 1, 4)
    return tiles.contiguous().view(-1).view(plain.dtype)


def plain_scales(blocked: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """The inverse of :func:`blocked_scales`: the (rows, blocks) matrix."""
    rt, ct = _ceil_div(rows, 128), _ceil_div(blocks, 4)
    if blocked.dim() != 1 or blocked.numel() != rt * ct * 512:
        raise ValueError(
            f"rtcnorm.QuantizedTensor: blocked scales must be 1-D with {rt * ct * 512} elements for "
            f"{rows} rows of {blocks} blocks, got shape {tuple(blocked.shape)}"
        )
    b = blocked.view(torch.uint8).view(rt, ct, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return b.reshape(rt * 128, ct * 4)[:rows, :blocks].contiguous().view(blocked.dtype)


def _times_blocks(q: torch.Tensor, s: torch.Tensor, block: int) -> torch.Tensor:
    """q (rows, n) times s (rows, ceil(n / block)), each scale over its block."""
    rows, n = q.shape
    blocks = s.shape[1]
    q = torch.nn.functional.pad(q, (0, blocks * block - n)).view(rows, blocks, block)
    return (q * s.unsqueeze(-1)).view(rows, blocks * block)[:, :n]


def _e2m1_values(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Packed E2M1 (rows, ceil(n / 2)) as fp32 (rows, n): element 2k in the low
    nibble of byte k, 2k+1 in the high nibble. Decoded arithmetically (sign
    bit 3, exponent bits 1-2 with bias 1, mantissa bit 0), so no table is
    copied to the device."""
    b = packed.view(torch.uint8)
    codes = torch.stack((b & 0xF, b >> 4), dim=-1).view(b.shape[0], 2 * b.shape[1])[:, :n].int()
    e, m = (codes >> 1) & 3, (codes & 1).float()
    mag = torch.where(e == 0, m * 0.5, torch.ldexp(1 + m * 0.5, e - 1))
    return torch.where(codes >= 8, -mag, mag)


_WRAP_OPS = {}  # aten op -> what it does to each held tensor (the result stays quantized)


class QuantizedTensor(torch.Tensor):
    """A norm output in quantized form; dtype and shape are the unquantized
    output's. ``dequantize()`` gives the dense tensor.

    Held: ``qdata`` (the data; nvfp4 packed two per byte over (rows, n)),
    ``scale`` (per_tensor: shape (); per_token: (rows, 1) over the leading
    dims; mxfp8 / nvfp4: block scales, (rows, blocks) plain or 1-D blocked),
    ``absmax`` (the unquantized output's fp32 amax, shape (), per_tensor and
    nvfp4; else empty), ``global_scale`` (nvfp4's encode scale gs, shape
    ()), ``recipe``, ``scale_layout``, ``orig_dtype`` and ``n`` (the
    normalized width, a divisor of the size).

    detach, alias, clone and device moves keep it quantized; in-place writes
    to it raise; every other op runs on ``dequantize()``.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, qdata, scale, absmax, *, recipe, scale_layout="plain", orig_dtype, n, shape, global_scale=None):
        if recipe not in RECIPE_DTYPES:
            raise ValueError(f"rtcnorm.QuantizedTensor: recipe must be one of {_names(RECIPE_DTYPES)}, got {recipe!r}")
        if qdata.dtype not in RECIPE_DTYPES[recipe]:
            raise ValueError(
                f"rtcnorm.QuantizedTensor: qdata for recipe {recipe!r} must be "
                f"{_dtype_names(RECIPE_DTYPES[recipe])}, got {qdata.dtype}"
            )
        if scale_layout not in LAYOUTS or (scale_layout == "blocked" and recipe not in BLOCK_SIZE):
            raise ValueError(
                f"rtcnorm.QuantizedTensor: scale_layout {scale_layout!r} is not valid for recipe {recipe!r}"
            )
        if (recipe == "nvfp4") != (global_scale is not None):
            raise ValueError("rtcnorm.QuantizedTensor: global_scale is required for nvfp4 and only for it")
        if n < 1 or math.prod(shape) % n:
            raise ValueError(
                f"rtcnorm.QuantizedTensor: n ({n}) must be a positive divisor of shape {tuple(shape)}'s size"
            )
        return torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=orig_dtype, device=qdata.device, requires_grad=False
        )

    def __init__(self, qdata, scale, absmax, *, recipe, scale_layout="plain", orig_dtype, n, shape, global_scale=None):
        self.qdata, self.scale, self.absmax, self.global_scale = qdata, scale, absmax, global_scale
        self.recipe, self.scale_layout, self.orig_dtype, self.n = recipe, scale_layout, orig_dtype, int(n)

    def __repr__(self):
        return (
            f"QuantizedTensor(recipe={self.recipe!r}, scale_layout={self.scale_layout!r}, shape={tuple(self.shape)}, "
            f"dtype={self.orig_dtype}, qdtype={self.qdata.dtype}, device={self.device})"
        )

    def _rewrap(self, fn) -> QuantizedTensor:
        return QuantizedTensor(
            fn(self.qdata),
            fn(self.scale),
            fn(self.absmax),
            recipe=self.recipe,
            scale_layout=self.scale_layout,
            orig_dtype=self.orig_dtype,
            n=self.n,
            shape=self.shape,
            global_scale=None if self.global_scale is None else fn(self.global_scale),
        )

    def dequantize(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dense tensor, in ``orig_dtype`` (or ``dtype``); the arithmetic is
        fp32. Differentiable: its gradient reaches this tensor unchanged."""
        if self.requires_grad and torch.is_grad_enabled():
            return _Dequantize.apply(self, dtype)
        return self._dense(dtype)

    def _dense(self, dtype=None) -> torch.Tensor:
        return self._dense_fp32().view(self.shape).to(dtype or self.orig_dtype)

    def _dense_fp32(self) -> torch.Tensor:
        n = self.n
        rows = self.numel() // n
        if self.recipe == "nvfp4":
            q = _e2m1_values(self.qdata.reshape(rows, _ceil_div(n, 2)), n)
        else:
            q = self.qdata.reshape(rows, n).float()
        if self.recipe == "per_tensor":
            return q * self.scale.float().reshape(())
        if self.recipe == "per_token":
            return q * self.scale.float().reshape(rows, 1)
        block = BLOCK_SIZE[self.recipe]
        blocks = _ceil_div(n, block)
        s = self.scale.reshape(rows, blocks) if self.scale_layout == "plain" else plain_scales(self.scale, rows, blocks)
        y = _times_blocks(q, s.float(), block)
        return y if self.recipe == "mxfp8" else y / self.global_scale.float().reshape(())

    def __tensor_flatten__(self):
        names = ["qdata", "scale", "absmax"] + ([] if self.global_scale is None else ["global_scale"])
        return names, (self.recipe, self.scale_layout, self.orig_dtype, self.n)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        recipe, scale_layout, orig_dtype, n = ctx
        return QuantizedTensor(
            inner["qdata"],
            inner["scale"],
            inner["absmax"],
            recipe=recipe,
            scale_layout=scale_layout,
            orig_dtype=orig_dtype,
            n=n,
            shape=outer_size,
            global_scale=inner.get("global_scale"),
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        wrap = _WRAP_OPS.get(func)
        if wrap is not None:
            out = wrap(args, kwargs)
            if out is not None:
                return out
        if func._schema.is_mutable:
            _refuse_writes(func, args, kwargs)
        args, kwargs = tree_map_only(QuantizedTensor, lambda t: t._dense(), (args, kwargs))
        return func(*args, **kwargs)


class _Dequantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qt, dtype):
        ctx.orig_dtype = qt.orig_dtype
        return qt._dense(dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.orig_dtype), None


def _refuse_writes(func, args, kwargs):
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            v = args[i] if i < len(args) else kwargs.get(a.name)
            if isinstance(v, QuantizedTensor):
                raise RuntimeError(
                    f"rtcnorm.QuantizedTensor is read-only: {func} would write to it; "
                    "call .dequantize() for a dense copy"
                )


def _same(fn):
    return lambda args, kwargs: args[0]._rewrap(fn)


def _to_copy(args, kwargs):
    t = args[0]
    dtype = kwargs.get("dtype")
    if dtype is not None and dtype != t.orig_dtype:
        return None  # a dense tensor in the new dtype
    device = kwargs.get("device")
    return t._rewrap(lambda x: x.to(device=device, copy=True, non_blocking=kwargs.get("non_blocking", False)))


def _view(args, kwargs):
    t, size = args[0], args[1]
    if tuple(size) == tuple(t.shape):
        return t._rewrap(torch.ops.aten.alias.default)
    return None  # a new shape: a dense view


aten = torch.ops.aten
_WRAP_OPS.update(
    {
        aten.detach.default: _same(aten.detach.default),
        aten.alias.default: _same(aten.alias.default),
        aten.clone.default: _same(aten.clone.default),
        aten._to_copy.default: _to_copy,
        aten.view.default: _view,
        aten._unsafe_view.default: _view,
    }
)
