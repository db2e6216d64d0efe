"""``python -m rtcnorm`` / ``rtcnorm``: inspect the install, fill and check the kernel cache, benchmark.

Every error is one line on stderr with a non-zero exit status: 2 for bad
arguments, 1 for a failed command.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import time

import torch

DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}
NORM_OPS = ("rms_norm", "layer_norm")
# precompile also takes the quantized-output forwards (norm_quant), never by default.
PRECOMPILE_OPS = (*NORM_OPS, "rms_norm_quant", "layer_norm_quant")


class CliError(Exception):
    """A failure reported as one line, exit status 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def _count(s: str) -> int:
    if not s.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {s!r}")
    return int(s)


def _dtype(s: str) -> torch.dtype:
    if s.lower() not in DTYPES:
        raise argparse.ArgumentTypeError(f"expected one of bfloat16, float16, float32, got {s!r}")
    return DTYPES[s.lower()]


def _arch(s: str) -> str:
    a = s.lower().removeprefix("sm_")
    if not a.isdigit():
        raise argparse.ArgumentTypeError(f"expected an arch like sm_90, got {s!r}")
    return f"sm_{a}"


def _group(s: str) -> int | None:
    if s.upper() == "N":
        return None
    if not s.isdigit() or int(s) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or N (one group a row), got {s!r}")
    return int(s)


def _mode(s: str):
    from .modes import MODES

    if s == "auto":
        return None
    if s not in MODES:
        raise argparse.ArgumentTypeError(f"expected auto or one of {', '.join(MODES)}, got {s!r}")
    return s


def _shape(s: str) -> tuple[int, int]:
    parts = s.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected ROWSxHIDDEN such as 4096x4096, got {s!r}")
    return int(parts[0]), int(parts[1])


# ---- info --------------------------------------------------------------------


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_info(args) -> int:
    import rtcnorm

    from . import _C, cli_cache

    print(f"rtcnorm {rtcnorm.__version__} ({os.path.dirname(rtcnorm.__file__)})")
    print(f"torch   {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    try:
        nv = rtcnorm.jit.nvrtc_info()
        archs = " ".join(f"sm_{a}" for a in nv.get("archs", []))
        print(f"NVRTC   {nv['version']} at {nv['path']}\n        targets: {archs}")
    except Exception as e:
        print(f"NVRTC   not found: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    root = rtcnorm.jit.cache_dir()
    rows = cli_cache.usage(root)
    files, size = sum(r.entries for r in rows), sum(r.bytes for r in rows)
    state = "" if _C.disk_cache_enabled() else " (disabled: RTCNORM_DISABLE_DISK_CACHE=1)"
    print(f"cache   {root}: {files} kernels, {_human(size)}{state}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            print(f"GPU {i}   {torch.cuda.get_device_name(i)}, sm_{major}{minor}")
    else:
        print("GPU     no GPU visible")
    return 0


# ---- precompile --------------------------------------------------------------


def _read_config(path: str) -> dict:
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path) as f:
            cfg = json.load(f)
    except OSError as e:
        raise CliError(f"--model: cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise CliError(f"--model: {path} is not JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise CliError(f"--model: {path} holds no JSON object")
    # Multimodal configs keep the language model under text_config.
    return {**cfg, **cfg["text_config"]} if isinstance(cfg.get("text_config"), dict) else cfg


def sizes_from_config(cfg: dict) -> tuple[dict[str, list[int]], torch.dtype | None]:
    """Which norm ops a Hugging Face config's model runs, at which row lengths, and its dtype.

    The op is read from the epsilon key (``rms_norm_eps``: RMSNorm;
    ``layer_norm_eps`` / ``layer_norm_epsilon``: LayerNorm). Row lengths: the
    hidden size; the head dim for per-head QK-norm (Qwen3, Gemma3, or a
    ``use_qk_norm`` / ``qk_layernorm`` flag); the low-rank q / kv widths of
    multi-head latent attention (DeepSeek-V3).
    """
    hidden = cfg.get("hidden_size", cfg.get("n_embd", cfg.get("d_model")))
    if not isinstance(hidden, int) or hidden < 1:
        raise CliError("--model: the config has no hidden_size (nor n_embd, d_model)")
    if "rms_norm_eps" in cfg:
        op = "rms_norm"
    elif "layer_norm_eps" in cfg or "layer_norm_epsilon" in cfg:
        op = "layer_norm"
    else:
        raise CliError("--model: the config names no norm epsilon (rms_norm_eps, layer_norm_eps, layer_norm_epsilon)")
    sizes = [hidden]
    model_type = str(cfg.get("model_type", ""))
    qk_norm = model_type.startswith(("qwen3", "gemma3")) or cfg.get("use_qk_norm") or cfg.get("qk_layernorm")
    if qk_norm:
        heads = cfg.get("num_attention_heads", cfg.get("n_head"))
        head_dim = cfg.get("head_dim") or (hidden // heads if heads else None)
        if head_dim:
            sizes.append(int(head_dim))
    sizes += [int(cfg[k]) for k in ("q_lora_rank", "kv_lora_rank") if isinstance(cfg.get(k), int)]
    dtype = DTYPES.get(str(cfg.get("dtype", cfg.get("torch_dtype", ""))))
    return {op: sorted(set(sizes))}, dtype


def _supports_progress() -> bool:
    from . import jit

    return "progress" in inspect.signature(jit.precompile).parameters


class _NoBar:
    """Stands in for a tqdm bar where tqdm is not installed: no output."""

    def __init__(self, iterable=None, **_):
        self.iterable, self.n, self.total = iterable, 0, 0

    def __iter__(self):
        return iter(self.iterable)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def refresh(self):
        pass

    def set_postfix_str(self, s):
        pass


def cmd_precompile(args) -> int:
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = _NoBar

    from . import jit
    from .modes import MODES

    if (args.model is None) == (args.hidden_sizes is None):
        raise CliError("give --hidden-sizes or --model (one of them)")
    dtypes = args.dtypes
    if args.model is not None:
        plan, cfg_dtype = sizes_from_config(_read_config(args.model))
        if args.ops:
            plan = {op: plan.get(op, next(iter(plan.values()))) for op in args.ops}
        dtypes = dtypes or ([cfg_dtype] if cfg_dtype else None)
        said = "; ".join(f"{op} at {', '.join(map(str, ns))}" for op, ns in plan.items())
        print(f"from {args.model}: {said}", file=sys.stderr)
    else:
        plan = {op: args.hidden_sizes for op in (args.ops or NORM_OPS)}
    dtypes = dtypes or [torch.bfloat16, torch.float16, torch.float32]
    modes = args.modes or [None, *MODES]
    kw = dict(dtypes=dtypes, modes=modes, archs=args.archs, threads=args.threads)
    if args.group_sizes:
        kw["group_sizes"] = args.group_sizes
    lines: list[str] = []
    t0 = time.perf_counter()
    disable = args.quiet or None  # None: tqdm draws only on a terminal
    if _supports_progress():
        with tqdm(total=0, unit="kernel", desc="precompile", disable=disable) as bar:

            def progress(done: int, total: int) -> None:
                bar.total = base + total
                bar.n = base + done
                bar.refresh()

            for op, ns in plan.items():
                base = bar.n
                lines += jit.precompile(op, hidden_sizes=ns, progress=progress, **kw)
    else:
        calls = [(op, n) for op, ns in plan.items() for n in ns]
        with tqdm(calls, unit="size", desc="precompile", disable=disable) as bar:
            for op, n in bar:
                bar.set_postfix_str(f"{op} {n}")
                lines += jit.precompile(op, hidden_sizes=[n], **kw)
    # A kernel shared by two ops (or sizes) is listed by each call: count it
    # once, as compiled if any call compiled it.
    kernels: dict[str, bool] = {}
    for line in lines:
        name, status = line.rsplit(" ", 1)
        kernels[name] = kernels.get(name, False) or status == "compiled"
    compiled = sum(kernels.values())
    secs = time.perf_counter() - t0
    print(
        f"{len(kernels)} kernels ({compiled} compiled, {len(kernels) - compiled} already cached) "
        f"in {secs:.1f} s into {jit.cache_dir()}"
    )
    if args.verbose:
        print("\n".join(sorted(lines)))
    return 0


# ---- cache, bench, tune ------------------------------------------------------


def cmd_cache(args) -> int:
    from . import _C, cli_cache, jit

    root = jit.cache_dir()
    if args.action == "stats":
        rows = cli_cache.usage(root)
        print(f"cache {root}")
        for r in rows:
            print(f"  {r.arch:<8} {r.entries:>7} kernels {_human(r.bytes):>10}")
        files, size = sum(r.entries for r in rows), sum(r.bytes for r in rows)
        print(f"  {'total':<8} {files:>7} kernels {_human(size):>10}")
        if not _C.disk_cache_enabled():
            print("  (the disk cache is disabled: RTCNORM_DISABLE_DISK_CACHE=1)")
        return 0
    if args.action == "clear":
        print(f"removed {jit.clear_cache()} kernels from {root}")
        return 0
    checked, bad = cli_cache.verify(root)
    for path, why in bad:
        print(f"bad: {path}: {why}")
        if args.remove:
            os.unlink(path)
    verdict = "all intact" if not bad else f"{len(bad)} bad" + (" (removed)" if args.remove else "")
    print(f"checked {checked} kernels in {root}: {verdict}")
    return 1 if bad else 0


def cmd_bench(args) -> int:
    if not torch.cuda.is_available():
        raise CliError("bench needs a CUDA GPU and none is visible")
    from . import cli_bench

    rows = cli_bench.run(args.shapes, args.ops, args.dtype)
    print(cli_bench.table(rows, f"{torch.cuda.get_device_name()} ({args.dtype})".replace("torch.", "")))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="rtcnorm",
        description="rtcnorm: NVRTC-compiled norm and softmax kernels for PyTorch.",
        epilog="Run 'rtcnorm COMMAND --help' for a command's options.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    s = sub.add_parser("info", help="versions, NVRTC, the kernel cache and the GPUs")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser(
        "precompile",
        help="compile kernels into the disk cache (no GPU needed)",
        description="Compile every kernel the ops may launch for these row lengths into the disk cache, "
        "on all cores, with no GPU. Take the sizes from --hidden-sizes or from a Hugging Face config (--model).",
    )
    s.add_argument("--ops", nargs="+", metavar="OP", help="ops (default: rms_norm layer_norm, or the model's)")
    s.add_argument("--hidden-sizes", nargs="+", type=_positive_int, metavar="N", help="row lengths")
    s.add_argument("--model", metavar="PATH", help="a config.json, or a folder holding one")
    s.add_argument(
        "--dtypes",
        nargs="+",
        type=_dtype,
        metavar="DTYPE",
        help="bf16, fp16, fp32 (default: all three, or the model's)",
    )
    s.add_argument(
        "--archs",
        nargs="+",
        type=_arch,
        default=["sm_80", "sm_90", "sm_100"],
        metavar="ARCH",
        help="default: %(default)s",
    )
    s.add_argument("--modes", nargs="+", type=_mode, metavar="MODE", help="auto and/or forward modes (default: all)")
    s.add_argument("--group-sizes", nargs="+", type=_group, metavar="G", help="gated ops (default N: a row)")
    s.add_argument("--threads", type=_count, default=0, help="compile threads (default 0: every core)")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.add_argument("-v", "--verbose", action="store_true", help="list every kernel")
    s.set_defaults(func=cmd_precompile)

    s = sub.add_parser("cache", help="the disk kernel cache: stats, clear, verify")
    cs = s.add_subparsers(dest="action", metavar="ACTION", required=True)
    cs.add_parser("stats", help="kernels and bytes per arch").set_defaults(func=cmd_cache)
    cs.add_parser("clear", help="remove every kernel of this version").set_defaults(func=cmd_cache)
    v = cs.add_parser("verify", help="check every entry's checksum; exit 1 if any is bad")
    v.add_argument("--remove", action="store_true", help="delete the bad entries")
    v.set_defaults(func=cmd_cache)

    s = sub.add_parser("bench", help="GB/s of rtcnorm and torch, forward and backward (GPU)")
    s.add_argument("--shapes", nargs="+", type=_shape, default=[(4096, 4096), (16384, 8192)], metavar="MxN")
    s.add_argument("--ops", nargs="+", choices=PRECOMPILE_OPS, default=list(NORM_OPS))
    s.add_argument("--dtype", type=_dtype, default=torch.bfloat16)
    s.set_defaults(func=cmd_bench)

    from . import cli_tune

    cli_tune.add_parser(sub, _shape, _dtype, NORM_OPS)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.prog = f"rtcnorm {args.command}"
    try:
        return args.func(args)
    except CliError as e:
        print(f"{args.prog}: error: {e}", file=sys.stderr)
    except (ValueError, RuntimeError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"{args.prog}: error: {first}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"{args.prog}: interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
