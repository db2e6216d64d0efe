#!/usr/bin/env bash
# The end-to-end model benchmark on four GPUs at once: one family per GPU
# (qwen3, llama, gemma3, gpt2), each within BUDGET seconds (default 270), then
# one merged table and plot. Usage, from anywhere:
#
#   PYTHONPATH=$PWD/python:/tmp/peers benchmarks/run_models_gpu.sh OUT [BUDGET]
#
# Writes OUT/models.{json,md,png}, OUT/readme_models.md (the README's table),
# and under OUT/parts/ each family's JSON (rewritten after every variant), its
# log and one profile per variant. Liger is used when importable (PYTHONPATH);
# otherwise its rows say why they were skipped. With fewer than four GPUs the
# families share them in turn. At most about BUDGET + 60 seconds of wall time.
# MODELS_ARGS adds arguments to every bench_models.py run: NGPU=4
# MODELS_ARGS="--smoke --device cpu --backend aot_eager" is a CPU dry run.
set -uo pipefail
out=${1:?usage: run_models_gpu.sh OUT [BUDGET]}
budget=${2:-270}
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out/parts"
found=$(python3 -c "
import matplotlib, rtcnorm, torch, transformers
try:
    import liger_kernel.transformers
    liger = 'importable'
except Exception as e:
    liger = 'not importable: ' + str(e).splitlines()[0]
print(torch.cuda.device_count(), 'rtcnorm', rtcnorm.__version__, 'torch', torch.__version__,
      'transformers', transformers.__version__, '- Liger', liger)
" 2>/dev/null) || { echo "run_models_gpu.sh: needs rtcnorm, torch, transformers and matplotlib importable" >&2; exit 1; }
echo "${found#* }"
ngpu=${NGPU:-${found%% *}}
[ "$ngpu" -ge 1 ] || { echo "run_models_gpu.sh: no GPU visible to torch (NGPU=1 forces one)" >&2; exit 1; }
# The four processes share rtcnorm's disk cache (flock) and torch.compile's;
# each gets a quarter of the host's cores.
quarter=$(($(nproc) / 4 > 1 ? $(nproc) / 4 : 1))
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-$quarter} OMP_NUM_THREADS=${OMP_NUM_THREADS:-$quarter}
families=(qwen3 llama gemma3 gpt2)
pids=()
for i in "${!families[@]}"; do
  fam=${families[$i]}
  # A runner ends its workers on SIGTERM; the outer timeout is a safety net only.
  CUDA_VISIBLE_DEVICES=$((i % ngpu)) timeout -k 10 $((budget + 45)) \
    python3 "$here/bench_models.py" --family "$fam" --out-dir "$out/parts" --budget "$budget" --profile ${MODELS_ARGS:-} \
    >"$out/parts/$fam.log" 2>&1 &
  pids+=($!)
  [ "$ngpu" -ge 4 ] || [ $(((i + 1) % ngpu)) -ne 0 ] || wait "${pids[@]}"
done
wait "${pids[@]}"
grep -h -E "^(qwen3|llama|gemma3|gpt2) " "$out"/parts/*.log
python3 "$here/bench_models.py" --merge "$out/parts" --out "$out/models"
python3 "$here/readme_models.py" "$out/models.json" >"$out/readme_models.md" && cat "$out/readme_models.md"
