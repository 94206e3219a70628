#!/usr/bin/env bash
# Every GPU-only check in one run (about 3-5 minutes on one H200), results in $OUT/gpu_check.json
# and the log in $OUT/gpu_check.log. The machine's own python3 (with CUDA PyTorch, transformers and
# safetensors: bench/gpu_check.py builds its random-weight models with them, so no model, tokenizer
# or sentence-transformers is needed there) runs it from the repository root.
#
# Optional packages (FlashInfer, say) travel as wheels in .whl/ at the repository root, carried with
# the run: they are installed into /tmp/site first. Extra arguments go to bench.gpu_check
# (e.g. --only qwen3 --only gemma3).
set -euo pipefail
cd "$(dirname "$0")/.."
outdir="${OUT:-.}"
out="$outdir/gpu_check.json"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# the import namespace: embedfleet/ links to shared/ and services/; a copy of the tree that dropped the
# links gets them again (one that followed them holds real folders, which serve as well)
for pkg in shared services; do
    [ -e "embedfleet/$pkg" ] || ln -s "../$pkg" "embedfleet/$pkg"
done
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
# the device run's limit is 600 s: stop well before, with the JSON written after every model
timeout 540 python3 -m bench.gpu_check --out "$out" "$@" 2>&1 | tee "$outdir/gpu_check.log"
echo "results: $out"
