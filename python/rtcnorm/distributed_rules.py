"""DTensor sharding strategies for every ``torch.ops.rtcnorm`` op.

Imported by :func:`rtcnorm.distributed.register_sharding_rules` only (it
imports ``torch.distributed.tensor``, which costs about a second).

Each strategy follows the placement of the op's reference tensor (the norm's
input, the softmax's input or output) and asks every other tensor to match:

- Per-row tensors (input, residual, grad_out, grad_h, output) keep a
  ``Shard`` on a dim that is not reduced over and are replicated on every
  other mesh dim. A ``Shard`` on a reduced dim (the normalized dims; the
  softmax's key dim, and its query dim when causal) becomes ``Replicate``:
  DTensor all-gathers that input along that mesh dim before the op runs, so
  the op always sees whole rows. ``Partial`` inputs become ``Replicate``
  (an all-reduce), since no op here is linear in its input.
- Statistics (rstd, mean) have the input's leading dims, so they take the
  same placements: each rank keeps the statistics of its own rows.
- Weight and bias are replicated.
- Weight and bias gradients are ``Partial("sum")`` on every mesh dim where
  the rows are sharded: each rank holds the sum over its own rows, and the
  one reduction happens where DTensor or FSDP2 next needs the gradient.
- A mask keeps the input's ``Shard`` on the dims where it is as long as the
  input, and is replicated where it broadcasts (size 1 or absent).

Shards may be uneven (a dim not divisible by the mesh size), or empty on
some ranks: the ops are row-local and accept zero rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, RuntimeSchemaInfo
from torch.distributed.tensor._ops.utils import generate_redistribute_costs
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

_ops = torch.ops.rtcnorm

# Roles of a tensor argument or output.
ROW = "row"  # element per input element, or one per row: follows the rows' placement
PARAM = "param"  # weight or bias: replicated
MASK = "mask"  # broadcastable to the input: follows it where not broadcast
GRAD = "grad"  # weight/bias gradient: Partial where rows are sharded
EMPTY = "empty"  # placeholder for a gradient that was not asked for
AMAX = "amax"  # max over every row: Partial("max") where rows are sharded


def row_placements(placements: Sequence[Placement], first_reduced_dim: int) -> tuple[Placement, ...]:
    """``placements`` with every Shard at or past ``first_reduced_dim`` and
    every Partial turned into Replicate: the placements an op reducing over
    the dims from ``first_reduced_dim`` on can run with locally. A
    ``_StridedShard`` (not a ``Shard`` subclass in torch 2.11) is gathered
    too: correct, though not free."""
    return tuple(p if isinstance(p, Shard) and p.dim < first_reduced_dim else Replicate() for p in placements)


def grad_placements(rows: Sequence[Placement], reduce_op: str = "sum") -> tuple[Placement, ...]:
    """Placements of a reduction over every row (weight/bias gradients: sum;
    a quantized output's amax: max) when the rows have placements ``rows``."""
    return tuple(Partial(reduce_op) if isinstance(p, Shard) else Replicate() for p in rows)


def mask_placements(rows: Sequence[Placement], input_shape, mask_shape) -> tuple[Placement, ...]:
    """A mask's placements for an input with placements ``rows``: the same
    Shard where the mask spans the input's dim, Replicate where it broadcasts."""
    offset = len(input_shape) - len(mask_shape)
    out: list[Placement] = []
    for p in rows:
        if isinstance(p, Shard):
            d = p.dim - offset
            if d >= 0 and mask_shape[d] == input_shape[p.dim]:
                out.append(Shard(d))
                continue
        out.append(Replicate())
    return tuple(out)


def _arguments(op_schema: OpSchema) -> list[tuple[str, object]]:
    """(name, value) of every argument given, positional ones first, in the
    order DTensor lists their strategies (args, then kwargs)."""
    names = [a.name for a in op_schema.op._schema.arguments]
    return list(zip(names, op_schema.args_schema)) + list(op_schema.kwargs_schema.items())


def _arg(op_schema: OpSchema, name: str, default=None):
    return dict(_arguments(op_schema)).get(name, default)


def _follow(op_schema: OpSchema, ref: str, first_reduced_dim: int, roles: dict, out_roles: Sequence[str]):
    """The one OpSpec of an op: each DTensor argument redistributed to its
    role's placements (``roles`` by argument name), derived from the
    placements of the argument named ``ref``."""
    ref_strategy: OpStrategy = _arg(op_schema, ref)
    mesh = ref_strategy.mesh
    rows = row_placements(ref_strategy.strategies[0].output_spec.placements, first_reduced_dim)
    input_specs, costs = [], []
    for name, strategy in _arguments(op_schema):
        if not isinstance(strategy, OpStrategy):
            continue
        role = roles[name]
        if role == ROW:
            placements = rows
        elif role == MASK:
            placements = mask_placements(rows, ref_strategy.shape, strategy.shape)
        else:
            placements = (Replicate(),) * mesh.ndim
        target = DTensorSpec(mesh, placements, tensor_meta=strategy.strategies[0].output_spec.tensor_meta)
        input_specs.append(target)
        costs.append(generate_redistribute_costs(strategy, target))
    outputs = []
    for role in out_roles:
        placements = {ROW: rows, GRAD: grad_placements(rows), AMAX: grad_placements(rows, "max")}.get(
            role, (Replicate(),) * mesh.ndim
        )
        outputs.append(DTensorSpec(mesh, placements))
    out = outputs[0] if len(outputs) == 1 else tuple(outputs)
    return OpStrategy([OpSpec(output_specs=out, input_specs=input_specs, redistribute_cost=costs)])


def _lead_dims(op_schema: OpSchema) -> int:
    return _arg(op_schema, "input").ndim - len(_arg(op_schema, "normalized_shape"))


def _norm(ref: str, roles: dict, out_roles: Sequence[str]):
    def strategy(op_schema: OpSchema) -> OpStrategy:
        return _follow(op_schema, ref, _lead_dims(op_schema), roles, out_roles)

    return strategy


def _want(op_schema: OpSchema, tensor: str, flag: str) -> str:
    return GRAD if _arg(op_schema, tensor) is not None and bool(_arg(op_schema, flag, False)) else EMPTY


# (input, normalized_shape, weight, ...) -> (y, rstd)
rms_norm_strategy = _norm("input", {"input": ROW, "weight": PARAM}, (ROW, ROW))
# (input, residual, normalized_shape, weight, ...) -> (y, h, rstd)
add_rms_norm_strategy = _norm("input", {"input": ROW, "residual": ROW, "weight": PARAM}, (ROW, ROW, ROW))
# (input, normalized_shape, weight, bias, ...) -> (y, mean, rstd)
layer_norm_strategy = _norm("input", {"input": ROW, "weight": PARAM, "bias": PARAM}, (ROW, ROW, ROW))


def rms_norm_backward_strategy(op_schema: OpSchema) -> OpStrategy:
    # (grad_out, input, rstd, weight, normalized_shape, zc, weight_grad, grad_h) -> (dx, dw)
    roles = {"grad_out": ROW, "input": ROW, "rstd": ROW, "weight": PARAM, "grad_h": ROW}
    dw = _want(op_schema, "weight", "weight_grad")
    return _follow(op_schema, "input", _lead_dims(op_schema), roles, (ROW, dw))


def layer_norm_backward_strategy(op_schema: OpSchema) -> OpStrategy:
    # (grad_out, input, mean, rstd, weight, bias, normalized_shape, zc, weight_grad, bias_grad) -> (dx, dw, db)
    roles = {"grad_out": ROW, "input": ROW, "mean": ROW, "rstd": ROW, "weight": PARAM, "bias": PARAM}
    dw = _want(op_schema, "weight", "weight_grad")
    db = _want(op_schema, "bias", "bias_grad")
    return _follow(op_schema, "input", _lead_dims(op_schema), roles, (ROW, dw, db))


# (input, gate, weight, eps, norm_before_gate, group_size, activation) -> (y, rstd):
# groups lie along the last dim, which stays whole.
def rms_norm_gated_strategy(op_schema: OpSchema) -> OpStrategy:
    roles = {"input": ROW, "gate": ROW, "weight": PARAM}
    return _follow(op_schema, "input", _arg(op_schema, "input").ndim - 1, roles, (ROW, ROW))


def rms_norm_gated_backward_strategy(op_schema: OpSchema) -> OpStrategy:
    # (grad_out, input, gate, rstd, weight, norm_before_gate, group_size, activation, weight_grad) -> (dx, dz, dw)
    roles = {"grad_out": ROW, "input": ROW, "gate": ROW, "rstd": ROW, "weight": PARAM}
    dw = _want(op_schema, "weight", "weight_grad")
    return _follow(op_schema, "input", _arg(op_schema, "input").ndim - 1, roles, (ROW, ROW, dw))


def _quant_roles(op_schema: OpSchema, lead_dims: int) -> tuple[int, str, str]:
    """A quantized output's first reduced dim and the roles of its scales and
    amax. Codes, per-row and plain block scales follow the rows; the tensor's
    amax is a max over the ranks' rows. The blocked scale layout tiles 128
    rows of the whole tensor, which no rank's rows form: its rows are gathered."""
    recipe = _arg(op_schema, "recipe")
    blocked = _arg(op_schema, "scale_layout", "plain") == "blocked"
    scales = PARAM if recipe == "per_tensor" else ROW
    amax = AMAX if recipe in ("per_tensor", "nvfp4") else EMPTY
    return (0 if blocked else lead_dims), scales, amax


def norm_quant_strategy(op_schema: OpSchema) -> OpStrategy:
    """(input, residual, normalized_shape, weight, bias, eps, norm, recipe,
    out_dtype, scale, scale_layout, ...) -> (data, scales, amax, h, mean, rstd)."""
    first_reduced, scales, amax = _quant_roles(op_schema, _lead_dims(op_schema))
    roles = {"input": ROW, "residual": ROW, "weight": PARAM, "bias": PARAM, "scale": PARAM}
    h = ROW if _arg(op_schema, "residual") is not None else EMPTY
    mean = ROW if _arg(op_schema, "norm") == "layer_norm" else EMPTY
    return _follow(op_schema, "input", first_reduced, roles, (ROW, scales, amax, h, mean, ROW))


def rms_norm_gated_quant_strategy(op_schema: OpSchema) -> OpStrategy:
    """(input, gate, weight, eps, norm_before_gate, group_size, activation,
    recipe, out_dtype, scale, scale_layout) -> (data, scales, amax, rstd):
    norm_quant's placements, with groups along the last dim kept whole."""
    first_reduced, scales, amax = _quant_roles(op_schema, _arg(op_schema, "input").ndim - 1)
    roles = {"input": ROW, "gate": ROW, "weight": PARAM, "scale": PARAM}
    return _follow(op_schema, "input", first_reduced, roles, (ROW, scales, amax, ROW))


# ---- softmax ----------------------------------------------------------------


def _softmax_dims(ndim: int, causal: bool) -> int:
    # A causal op's query q sees keys up to q + (sk - sq): q must be the
    # global index, so the query dim stays whole too.
    return ndim - 2 if causal else ndim - 1


def _softmax(causal: bool, roles: dict):
    def strategy(op_schema: OpSchema) -> OpStrategy:
        return _follow(op_schema, "input", _softmax_dims(_arg(op_schema, "input").ndim, causal), roles, (ROW,))

    return strategy


softmax_strategy = _softmax(False, {"input": ROW})
causal_softmax_strategy = _softmax(True, {"input": ROW})
masked_softmax_strategy = _softmax(False, {"input": ROW, "mask": MASK})


def softmax_backward_strategy(op_schema: OpSchema) -> OpStrategy:
    # (grad_output, output, scale, causal): follows the saved output.
    ndim = _arg(op_schema, "output").ndim
    dims = _softmax_dims(ndim, bool(_arg(op_schema, "causal", False)))
    return _follow(op_schema, "output", dims, {"grad_output": ROW, "output": ROW}, (ROW,))


STRATEGIES = {
    _ops.rms_norm.default: rms_norm_strategy,
    _ops.add_rms_norm.default: add_rms_norm_strategy,
    _ops.rms_norm_backward.default: rms_norm_backward_strategy,
    _ops.layer_norm.default: layer_norm_strategy,
    _ops.layer_norm_backward.default: layer_norm_backward_strategy,
    _ops.scaled_softmax.default: softmax_strategy,
    _ops.scaled_masked_softmax.default: masked_softmax_strategy,
    _ops.scaled_upper_triang_masked_softmax.default: causal_softmax_strategy,
    _ops.scaled_aligned_causal_masked_softmax.default: causal_softmax_strategy,
    _ops.scaled_softmax_backward.default: softmax_backward_strategy,
    _ops.rms_norm_gated.default: rms_norm_gated_strategy,
    _ops.rms_norm_gated_backward.default: rms_norm_gated_backward_strategy,
    _ops.norm_quant.default: norm_quant_strategy,
    _ops.rms_norm_gated_quant.default: rms_norm_gated_quant_strategy,
}


def register() -> None:
    """Register every strategy with DTensor's sharding propagator (idempotent).

    Every argument from index 1 on is part of the propagation cache key
    (static_argnum=1): the normalized shape and the flags decide placements.
    ``register_sharding`` keys on arguments from the first plain ``int`` one;
    these schemas have none, so it would key on the tensors alone and reuse
    one decision across normalized shapes of the same input.
    """
    propagator = DTensor._op_dispatcher.sharding_propagator
    for op, fn in STRATEGIES.items():
        propagator.register_op_strategy(op, fn, RuntimeSchemaInfo(1))
