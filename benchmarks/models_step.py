"""One variant of the end-to-end model benchmark: build a Hugging Face model from
its config class (random weights, nothing downloaded), swap its norms, optionally
compile its decoder layers, and time training steps (forward with the LM loss,
backward, AdamW). Used by bench_models.py, which runs each variant in a worker
process; nothing here knows about budgets or processes.
"""

from __future__ import annotations

import gc
import inspect
import re
import statistics
import time

import torch

FAMILIES = ("qwen3", "llama", "gemma3", "gpt2")
IMPLS = ("torch", "rtcnorm", "liger")
MODES = ("eager", "compile")
FULL = dict(hidden=2048, layers=4, heads=16, kv_heads=8, head_dim=128, mlp=8192, vocab=32000, seq=2048, batch=4)
SMOKE = dict(hidden=64, layers=1, heads=4, kv_heads=2, head_dim=16, mlp=128, vocab=256, seq=16, batch=2)
LIGER_PATCHES = {
    "llama": "apply_liger_kernel_to_llama",
    "qwen3": "apply_liger_kernel_to_qwen3",
    "gemma3": "apply_liger_kernel_to_gemma3_text",
}
# Kernel names of the fused norms (rtcnorm's NVRTC kernels, Liger's Triton ones).
NORM_KERNEL = re.compile(r"rms_?norm|layer_?norm", re.IGNORECASE)


class Skip(Exception):
    """A variant that cannot run here (a peer missing, no patch for the family)."""


def build_model(family: str, s: dict, device: torch.device, dtype: torch.dtype):
    """The model with seeded random weights, built on ``device`` (fast on a GPU)."""
    import transformers as tf

    decoder = dict(
        vocab_size=s["vocab"],
        num_hidden_layers=s["layers"],
        max_position_embeddings=s["seq"],
        hidden_size=s["hidden"],
        intermediate_size=s["mlp"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        use_cache=False,
    )
    if family == "llama":
        cfg, cls = tf.LlamaConfig(**decoder), tf.LlamaForCausalLM
    elif family == "qwen3":
        cfg, cls = tf.Qwen3Config(**decoder), tf.Qwen3ForCausalLM
    elif family == "gemma3":
        cfg, cls = tf.Gemma3TextConfig(**decoder), tf.Gemma3ForCausalLM
    elif family == "gpt2":
        cfg = tf.GPT2Config(
            vocab_size=s["vocab"],
            n_positions=s["seq"],
            n_embd=s["hidden"],
            n_layer=s["layers"],
            n_head=s["heads"],
            n_inner=s["mlp"],
            bos_token_id=0,
            eos_token_id=0,
            use_cache=False,
        )
        cls = tf.GPT2LMHeadModel
    else:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(cfg)
    return model.to(dtype=dtype).train()


def decoder_layers(model) -> list:
    for path in ("model.layers", "transformer.h"):
        obj = model
        try:
            for name in path.split("."):
                obj = getattr(obj, name)
        except AttributeError:
            continue
        return list(obj)
    raise RuntimeError(f"no decoder layers found in {type(model).__name__}")


def patch_summary(summary) -> dict:
    """rtcnorm's PatchSummary as JSON: counts, what each class ran as, why any was skipped."""
    kinds: dict[str, int] = {}
    for s in summary.swapped:
        key = f"{s.cls} as {s.kind}"
        kinds[key] = kinds.get(key, 0) + 1
    reasons = sorted({f"{s.cls}: {s.reason}" for s in summary.skipped})
    return dict(
        swapped=len(summary.swapped),
        skipped=len(summary.skipped),
        already=len(summary.already),
        kinds=kinds,
        reasons=reasons,
    )


def _liger_layer_norms(model) -> int:
    """Liger has no GPT-2 patch: swap each nn.LayerNorm for a LigerLayerNorm holding
    the same Parameter objects, as a user would by hand."""
    from liger_kernel.transformers import LigerLayerNorm

    swaps = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)]
    for name, ln in swaps:
        new = LigerLayerNorm(ln.normalized_shape[0], eps=ln.eps, bias=ln.bias is not None)
        new.weight, new.bias = ln.weight, ln.bias
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, new)
    return len(swaps)


def apply_impl(model, family: str, impl: str) -> dict:
    """Swaps the norms in place; returns what was done, for the row."""
    if impl == "torch":
        return {}
    if impl == "rtcnorm":
        import rtcnorm

        return dict(patch=patch_summary(rtcnorm.patch(model)))
    if impl != "liger":
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    try:
        import liger_kernel
        import liger_kernel.transformers as lt
    except ImportError as e:
        raise Skip(f"Liger is not importable: {e}") from None
    version = getattr(liger_kernel, "__version__", None)
    if version is None:
        from importlib.metadata import version as dist_version

        version = dist_version("liger-kernel")
    if family == "gpt2":
        n = _liger_layer_norms(model)
        return dict(liger=version, note=f"no apply_liger_kernel_to_gpt2: {n} LayerNorm by hand")
    fn = getattr(lt, LIGER_PATCHES[family], None)
    if fn is None:
        raise Skip(f"Liger {version} has no {LIGER_PATCHES[family]}")
    # Every switch off but the norm (no fused loss, RoPE or MLP kernels).
    off = {
        p.name: False
        for p in inspect.signature(fn).parameters.values()
        if isinstance(p.default, bool) and p.name != "rms_norm"
    }
    fn(model=model, rms_norm=True, **off)
    swapped = sum(1 for m in model.modules() if m._get_name().startswith("Liger"))
    return dict(liger=version, note=f"{fn.__name__}: {swapped} norms")


def _timed_step(step, cuda: bool) -> tuple[float, float]:
    """(step ms, host ms): the device-side time of one step, and the time until
    the host had queued all of it (equal when the step is host bound)."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t = time.perf_counter()
    step()
    host = (time.perf_counter() - t) * 1e3
    if cuda:
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end), host
    return host, host


def profile_step(step, cuda: bool, top: int) -> tuple[dict, str]:
    """One step under torch.profiler: where the time goes (host or device, which calls)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        step()
        host = (time.perf_counter() - t) * 1e3
        if cuda:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t) * 1e3
    ka = prof.key_averages()
    kernels = [e for e in ka if e.device_type == torch.autograd.DeviceType.CUDA]
    if cuda and not kernels:  # kernels reported as the device time of host-side events
        kernels = [e for e in ka if e.self_device_time_total > 0]
    by_dev = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)
    by_cpu = sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)
    summary = dict(
        wall_ms=wall,
        host_ms=host,
        device_busy_ms=sum(e.self_device_time_total for e in kernels) / 1e3,
        norm_kernel_ms=sum(e.self_device_time_total for e in kernels if NORM_KERNEL.search(e.key)) / 1e3,
        kernels=sum(e.count for e in kernels),
        top_cuda=[[e.key[:90], e.count, e.self_device_time_total / 1e3] for e in by_dev[:top]],
        top_cpu=[[e.key[:90], e.count, e.self_cpu_time_total / 1e3] for e in by_cpu[:top]],
    )
    text = []
    if cuda:
        text += ["Top CUDA (self device time)", ka.table(sort_by="self_device_time_total", row_limit=25), ""]
    text += ["Top CPU (self host time)", ka.table(sort_by="self_cpu_time_total", row_limit=25)]
    return summary, "\n".join(text)


def run_variant(family: str, impl: str, mode: str, s: dict, o) -> tuple[dict, str | None]:
    """Runs one variant; returns its row fields and, with ``o.profile``, the profile text.

    ``o`` carries device, dtype, warmup, steps, backend, profile and ``deadline``
    (a perf_counter time after which the optional profile step is left out).
    """
    import torch._dynamo

    device = torch.device(o.device)
    dtype = dict(bf16=torch.bfloat16, fp32=torch.float32)[o.dtype]
    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    model = build_model(family, s, device, dtype)
    row = apply_impl(model, family, impl)
    if mode == "compile":
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        for layer in decoder_layers(model):
            layer.compile(backend=o.backend)
    row["build_s"] = time.perf_counter() - t0
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    gen = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), generator=gen).to(device)
    losses = []

    def step():
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())

    t = time.perf_counter()
    step()
    if cuda:
        torch.cuda.synchronize()
    row["first_step_s"] = time.perf_counter() - t  # JIT kernels, autotuning, torch.compile
    for _ in range(max(o.warmup - 1, 0)):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = [_timed_step(step, cuda) for _ in range(o.steps)]
    row.update(
        step_ms=statistics.median(t for t, _ in times),
        host_ms=statistics.median(h for _, h in times),
        steps_ms=[round(t, 3) for t, _ in times],
        peak_mb=torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        loss0=float(losses[0]),
        loss=float(losses[-1]),
    )
    if mode == "compile":
        row["graphs"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    text = None
    if o.profile and time.perf_counter() < o.deadline:
        row["profile"], text = profile_step(step, cuda, top=8)
    return row, text


def release_memory() -> None:
    """Frees what the last variant left (its model is garbage once run_variant returned)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
