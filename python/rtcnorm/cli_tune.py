"""``rtcnorm tune``: measured tuning of norm launch plans on the GPU.

For each (op, shape) it runs :func:`rtcnorm.tune`: the planner's pick, its
ranked runners-up and the cheapest candidates of every design are timed,
forward and backward, and the fastest is stored in the disk cache, where
later processes find it. The table shows the planner's pick against the
winner.
"""

from __future__ import annotations

import torch


def add_parser(sub, shape_type, dtype_type, ops) -> None:
    s = sub.add_parser(
        "tune",
        help="time candidate launch plans on the GPU and keep the fastest",
        description="Time the planner's candidates for each op and shape on the GPU (forward and backward) and "
        "store the fastest in the disk cache beside the kernels; later calls of that exact problem launch it.",
    )
    s.add_argument("--shapes", nargs="+", type=shape_type, required=True, metavar="MxN", help="rows x hidden")
    s.add_argument("--ops", nargs="+", choices=ops, default=list(ops))
    s.add_argument("--dtype", type=dtype_type, default=torch.bfloat16)
    s.add_argument("--reps", type=int, default=10, help="timed calls per candidate (default: %(default)s)")
    s.add_argument("--no-persist", action="store_true", help="keep the winners for this process only")
    s.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    s.set_defaults(func=run)


def run(args) -> int:
    from .tuning import tune

    # The CLI prints a RuntimeError as one line and exits 1.
    if not torch.cuda.is_available():
        raise RuntimeError("tune needs a CUDA GPU and none is visible")
    if args.reps < 1:
        raise RuntimeError(f"--reps must be at least 1, got {args.reps}")
    jobs = [(op, shape) for shape in args.shapes for op in args.ops]
    try:
        from tqdm import tqdm

        jobs_iter = tqdm(jobs, desc="tuning", unit="problem", disable=args.quiet)
    except ImportError:
        jobs_iter = jobs
    lines = []
    for op, shape in jobs_iter:
        r = tune(op, shape, args.dtype, reps=args.reps, persist=not args.no_persist)
        for d in ("fwd", "bwd"):
            best, picked = r[d]["best"], r[d]["picked"]
            lines.append(
                f"{op:<11}{shape[0]}x{shape[1]:<10}{d:<5}{picked['ms'] * 1e3:>9.1f}{best['ms'] * 1e3:>9.1f}"
                f"{r[d]['speedup']:>8.2f}x  {best['design']} {best['knobs']}"
            )
    name = torch.cuda.get_device_name()
    print(f"{name} ({str(args.dtype).replace('torch.', '')}), device time in us, L2 flushed")
    print(f"{'op':<11}{'shape':<15}{'dir':<5}{'picked':>9}{'tuned':>9}{'gain':>9}  winner")
    print("\n".join(lines))
    return 0
