#!/usr/bin/env bash
# Every GPU-only check in one run (a few minutes on one GPU), results in $OUT/gpu_check.json.
# The machine's own python3 (with CUDA PyTorch and transformers) runs it from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}/gpu_check.json"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
timeout 270 python3 -m bench.gpu_check --out "$out"
echo "results: $out"
