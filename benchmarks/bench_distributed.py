"""rtcnorm under tensor + sequence parallel and FSDP2, against torch's norms.

    torchrun --nproc_per_node 2 benchmarks/bench_distributed.py --out DIR
    torchrun --nproc_per_node 2 benchmarks/bench_distributed.py --device cpu --tiny --out DIR

The Llama-style decoder of benchmarks/dist_model.py is built twice, with
rtcnorm (RMSNorm and causal softmax) and with torch (nn.RMSNorm and a masked
torch.softmax); everything else is the same. For each:

- numerics: one TP + SP step against the same model in one process (rank 0
  runs it on its own device): loss and every gradient;
- collectives: counts and bytes of one TP + SP step and one FSDP2 step
  (forward, backward, optimizer), in total and those DTensor issues to
  run a norm op (expected: none; the norm weights' Partial gradients are
  all-reduced once, by the optimizer step, as with torch's norms);
- step time: forward + backward + SGD step under TP + SP and under FSDP2.

Bytes are the size of the largest buffer a collective touches (the gathered
tensor, the tensor reduced from, the all-reduced tensor). Writes
DIR/bench_distributed.json and DIR/bench_distributed.md (rank 0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from collections import defaultdict
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dist_model  # noqa: E402

FULL = dict(dim=4096, heads=32, hidden=11008, layers=2, vocab=8192, batch=1, seq=4096)
TINY = dict(dim=64, heads=4, hidden=128, layers=2, vocab=32, batch=1, seq=16)
VARIANTS = ("torch", "rtcnorm")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory for bench_distributed.json and .md")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="tiny widths (a CI check of the plumbing)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default=None, help="default: bf16 on cuda, fp32 on cpu")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10; 2 with --tiny)")
    p.add_argument("--warmup", type=int, default=3)
    return p.parse_args(argv)


def _is_norm_op(name: str) -> bool:
    return "rms_norm" in name or "layer_norm" in name


class CommBytes(CommDebugMode):
    """CommDebugMode that also sums bytes per collective, and counts the
    collectives DTensor issues while dispatching a norm op (the mode sees
    each DTensor op before the redistributions it causes)."""

    def __enter__(self):
        self.bytes = defaultdict(int)
        self.norm_ops = {"count": 0, "bytes": 0}
        self.by_op = defaultdict(int)  # "dtensor op -> collective": count
        self._dtensor_op = ""
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            self._dtensor_op = str(func)
        before = self.get_total_counts()
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is not NotImplemented and self.get_total_counts() > before:
            tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            size = max((t.numel() * t.element_size() for t in tensors), default=0)
            self.bytes[str(func._overloadpacket.__name__)] += size
            self.by_op[f"{self._dtensor_op or '-'} -> {func._overloadpacket.__name__}"] += 1
            if _is_norm_op(self._dtensor_op):
                self.norm_ops["count"] += 1
                self.norm_ops["bytes"] += size
        return out


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _build(norms, cfg, device, dtype):
    with torch.device(device):
        model = dist_model.Decoder(cfg["dim"], cfg["heads"], cfg["hidden"], cfg["layers"], cfg["vocab"], norms=norms)
    dist_model.init_weights(model, seed=0)
    return model.to(dtype)


def _batch(cfg, device, dtype, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(cfg["batch"], cfg["seq"], cfg["dim"], generator=g, device=device, dtype=torch.float32)
    target = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g, device=device)
    return x.to(dtype), target


def _full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def _setups(norms, cfg, device, dtype, mesh):
    """(plan name, model, inputs for this rank) for TP + SP and FSDP2."""
    x, target = _batch(cfg, device, dtype, seed=1)
    tp = dist_model.apply_tp(_build(norms, cfg, device, dtype), mesh)
    yield "tp_sp", tp, (dist_model.sequence_shard(x, mesh), target)
    del tp
    x, target = _batch(cfg, device, dtype, seed=2 + dist.get_rank())  # data parallel: own batch
    yield "fsdp2", dist_model.apply_fsdp(_build(norms, cfg, device, dtype), mesh), (x, target)


def _step(model, opt, x, target):
    loss = dist_model.loss_fn(model(x), target)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def numerics(norms, cfg, device, dtype, mesh):
    """One TP + SP forward and backward against the model in one process."""
    x, target = _batch(cfg, device, dtype, seed=1)
    tp = dist_model.apply_tp(_build(norms, cfg, device, dtype), mesh)
    loss = dist_model.loss_fn(tp(dist_model.sequence_shard(x, mesh)), target)
    loss.backward()
    grads = {n: _full(p.grad) for n, p in tp.named_parameters()}  # collectives: every rank
    del tp
    if dist.get_rank() != 0:
        return None
    ref = _build(norms, cfg, device, dtype)
    loss_ref = dist_model.loss_fn(ref(x), target)
    loss_ref.backward()
    worst, worst_norm = (0.0, ""), (0.0, "")
    for name, p in ref.named_parameters():
        g_ref = p.grad.float()
        err = ((grads[name].float() - g_ref).abs().max() / g_ref.abs().max().clamp_min(1e-30)).item()
        worst = max(worst, (err, name))
        if "norm" in name:
            worst_norm = max(worst_norm, (err, name))
    del ref
    return {
        "loss": loss.item(),
        "loss_ref": loss_ref.item(),
        "loss_rel_err": abs(loss.item() - loss_ref.item()) / abs(loss_ref.item()),
        "grad_rel_err": worst[0],
        "grad_rel_err_param": worst[1],
        "norm_grad_rel_err": worst_norm[0],
        "norm_grad_rel_err_param": worst_norm[1],
    }


def _sgd(model):
    # The TP + SP plan leaves some parameters plain tensors beside DTensors;
    # the foreach update (CUDA's default) takes one tensor kind per list.
    return torch.optim.SGD(model.parameters(), lr=1e-4, foreach=False)


def collectives(model, x, target):
    """Counts and bytes of one step, in total and issued by norm ops."""
    opt = _sgd(model)
    _step(model, opt, x, target)  # warm: lazy init (FSDP2) is not a step's traffic
    with CommBytes() as comm:
        _step(model, opt, x, target)
    counts = {str(k.__name__): v for k, v in comm.get_comm_counts().items()}
    return {
        "counts": counts,
        "bytes": dict(comm.bytes),
        "total_count": sum(counts.values()),
        "total_bytes": sum(comm.bytes.values()),
        "by_dtensor_op": dict(comm.by_op),
        "norm_op_count": comm.norm_ops["count"],
        "norm_op_bytes": comm.norm_ops["bytes"],
    }


def step_time(model, x, target, device, steps, warmup):
    opt = _sgd(model)
    for _ in range(warmup):
        _step(model, opt, x, target)
    times = []
    for _ in range(steps):
        _sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        _step(model, opt, x, target)
        _sync(device)
        times.append(time.perf_counter() - t0)
    ms = torch.tensor(statistics.median(times) * 1e3, dtype=torch.float64, device=device)
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    return ms.item()


def run(args):
    """The benchmark on every rank; joins the default process group unless
    one is already up (the CPU test runs it inside its own workers)."""
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    own_group = not dist.is_initialized()
    if own_group:
        backend = "nccl" if device.type == "cuda" else "gloo"
        # a rank that fails alone leaves the others in a collective: 3 minutes at most
        dist.init_process_group(backend, timeout=timedelta(minutes=3), device_id=device if backend == "nccl" else None)
    backend = dist.get_backend()
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))
    cfg = TINY if args.tiny else FULL
    steps = args.steps or (2 if args.tiny else 10)
    mesh = init_device_mesh(args.device, (world,))
    result = {
        "meta": {
            "world_size": world,
            "backend": backend,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "dtype": str(dtype).removeprefix("torch."),
            "torch": torch.__version__,
            "config": cfg,
            "steps": steps,
            "warmup": args.warmup,
        },
        "numerics": {},
        "collectives": {n: {} for n in VARIANTS},
        "step_ms": {n: {} for n in VARIANTS},
        "errors": [],
    }
    t_start = time.perf_counter()
    for norms in VARIANTS:
        # An error that every rank meets (the usual kind) is recorded and the
        # run goes on, so the other sections still report.
        with _section(result, f"{norms} numerics"):
            result["numerics"][norms] = numerics(norms, cfg, device, dtype, mesh)
        with _section(result, f"{norms} plans"):
            for plan, model, (x, target) in _setups(norms, cfg, device, dtype, mesh):
                with _section(result, f"{norms} {plan}"):
                    result["collectives"][norms][plan] = collectives(model, x, target)
                    result["step_ms"][norms][plan] = step_time(model, x, target, device, steps, args.warmup)
                del model
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    result["meta"]["wall_s"] = round(time.perf_counter() - t_start, 1)
    if rank == 0:
        summarize(result)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "bench_distributed.json"), "w") as f:
            json.dump(result, f, indent=2)
        md = markdown(result)
        with open(os.path.join(args.out, "bench_distributed.md"), "w") as f:
            f.write(md)
        print(md)
    dist.barrier()
    if own_group:
        dist.destroy_process_group()
    return result


@contextlib.contextmanager
def _section(result, name):
    try:
        yield
    except Exception as e:
        traceback.print_exc()
        result["errors"].append(f"{name}: {type(e).__name__}: {str(e)[:500]}")


def summarize(result):
    """Verdicts: rtcnorm's TP error within twice torch's own (plus a floor),
    and no collective or byte beyond what the torch model moves. None where
    a section failed."""
    num = result["numerics"]
    floor = 2e-2 if result["meta"]["dtype"] == "bfloat16" else 1e-4
    result["numerics_ok"] = None
    if num.get("rtcnorm") and num.get("torch"):
        result["numerics_ok"] = all(
            num["rtcnorm"][k] <= max(2 * num["torch"][k], floor) for k in ("loss_rel_err", "grad_rel_err")
        )
    extra = {}
    for plan in ("tp_sp", "fsdp2"):
        a, b = result["collectives"]["rtcnorm"].get(plan), result["collectives"]["torch"].get(plan)
        if a and b:
            extra[plan] = {"count": a["total_count"] - b["total_count"], "bytes": a["total_bytes"] - b["total_bytes"]}
    result["extra_collectives_vs_torch"] = extra
    result["no_extra_traffic"] = (
        all(v["count"] == 0 and v["bytes"] == 0 for v in extra.values()) if len(extra) == 2 else None
    )


def _fmt(value, spec):
    return "n/a" if value is None else format(value, spec)


def markdown(result):
    m = result["meta"]
    cfg = m["config"]
    lines = [
        f"## rtcnorm vs torch norms, {m['world_size']} x {m['device']} ({m['backend']}), {m['dtype']}",
        "",
        f"hidden {cfg['dim']}, sequence {cfg['seq']}, batch {cfg['batch']}, {cfg['layers']} layers, "
        f"{cfg['heads']} heads, ffn {cfg['hidden']}, vocab {cfg['vocab']}; torch {m['torch']}; "
        f"median of {m['steps']} steps after {m['warmup']} warm-up.",
        "",
        "| norms | TP+SP step ms | FSDP2 step ms | TP+SP collectives (MB) | FSDP2 collectives (MB) "
        "| issued by norm ops (TP+SP) | loss rel err vs 1 process | worst grad rel err |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for norms in VARIANTS:
        c, t, n = result["collectives"][norms], result["step_ms"][norms], result["numerics"].get(norms) or {}

        def comm(plan, c=c):
            if plan not in c:
                return "n/a"
            return f"{c[plan]['total_count']} ({c[plan]['total_bytes'] / 2**20:.1f})"

        norm_ops = f"{c['tp_sp']['norm_op_count']} ({c['tp_sp']['norm_op_bytes']} B)" if "tp_sp" in c else "n/a"
        lines.append(
            f"| {norms} | {_fmt(t.get('tp_sp'), '.2f')} | {_fmt(t.get('fsdp2'), '.2f')} "
            f"| {comm('tp_sp')} | {comm('fsdp2')} | {norm_ops} "
            f"| {_fmt(n.get('loss_rel_err'), '.2e')} | {_fmt(n.get('grad_rel_err'), '.2e')} "
            f"({n.get('grad_rel_err_param', '')}) |"
        )
    extra = result["extra_collectives_vs_torch"]
    added = ", ".join(f"{plan} {v['count']} ({v['bytes']} B)" for plan, v in extra.items()) or "n/a"
    lines += [
        "",
        f"Numerics within twice torch's own TP error: **{result['numerics_ok']}**. "
        f"Collectives rtcnorm adds over torch's norms: {added}; none at all: **{result['no_extra_traffic']}**. "
        f"Wall time {m['wall_s']} s.",
        "",
    ]
    lines += [f"- error: {e}" for e in result["errors"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run(parse_args())
