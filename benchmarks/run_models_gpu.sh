#!/usr/bin/env bash
# The end-to-end model benchmark on one GPU, with Liger when its wheel is in
# .peers/small (see ../shared/peers/README.md); writes
# benchmarks/results/models_<gpu>.{json,md,png}. About 4-6 minutes on an H100,
# most of it torch.compile's first step of each compiled configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-h100}
if ls .peers/small/liger_kernel-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/peers .peers/small/liger_kernel-*.whl
  export PYTHONPATH=/tmp/peers${PYTHONPATH:+:$PYTHONPATH}
fi
make --no-print-directory build
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
python3 benchmarks/bench_models.py --out "benchmarks/results/models_${tag}"
