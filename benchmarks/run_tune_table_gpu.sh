#!/usr/bin/env bash
# The default-vs-tuned table on every GPU of the host: one shard per GPU, a
# compile phase on every shard at once (NVRTC in worker processes, into one
# shared disk cache), then a timing phase (one process per GPU, nothing else
# running), then the merged report. Usage, from the repository root:
#
#   PYTHONPATH=$PWD/python benchmarks/run_tune_table_gpu.sh [BUDGET] [DTYPES] [EXTRA...]
#
# BUDGET (default 540) bounds each phase in seconds; DTYPES defaults to
# bf16,fp16,fp32. EXTRA goes to the report (e.g. --export-package). Shard rows
# go to benchmarks/results/tune_table.shard<i>of<n>.jsonl as they are
# measured and logs to benchmarks/results/tune_table.shard<i>.log; running the
# script again resumes where a budget or a kill stopped it. The disk cache is
# RTCNORM_CACHE_DIR (default /tmp/rtcnorm-tune-table, created private).
set -uo pipefail
budget=${1:-540}
dtypes=${2:-bf16,fp16,fp32}
shift $(( $# < 2 ? $# : 2 ))
here="$(cd "$(dirname "$0")" && pwd)"
export RTCNORM_CACHE_DIR=${RTCNORM_CACHE_DIR:-/tmp/rtcnorm-tune-table}
mkdir -p "$RTCNORM_CACHE_DIR" && chmod 700 "$RTCNORM_CACHE_DIR"
ngpu=$(python3 -c "import torch; print(torch.cuda.device_count())") || exit 1
[ "$ngpu" -ge 1 ] || { echo "run_tune_table_gpu.sh: no CUDA device" >&2; exit 1; }
for phase in compile time; do
  pids=()
  for ((i = 0; i < ngpu; i++)); do
    CUDA_VISIBLE_DEVICES=$i python3 "$here/tune_table.py" --shard "$i/$ngpu" --phase "$phase" \
      --budget-s "$budget" --dtypes "$dtypes" >>"$here/results/tune_table.shard$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || echo "run_tune_table_gpu.sh: a $phase shard failed (see its log)" >&2; done
  tail -n 3 "$here"/results/tune_table.shard*.log
done
python3 "$here/tune_table.py" --report --dtypes "$dtypes" "$@"
