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
root="$(pwd)"
outdir="$(mkdir -p "${OUT:-.}" && cd "${OUT:-.}" && pwd)"
out="$outdir/gpu_check.json"
site="${TMPDIR:-/tmp}/embedfleet-site"
rm -rf "$site" && mkdir -p "$site/embedfleet"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
fi
# the package laid out as a wheel holds it (setup.py maps embedfleet.shared to shared/ and embedfleet.services
# to services/), with no install step; run from outside the tree, where ./embedfleet would be found first
cp embedfleet/*.py "$site/embedfleet/"
cp -r shared "$site/embedfleet/shared"
cp -r services "$site/embedfleet/services"
export PYTHONPATH="$site:$root${PYTHONPATH:+:$PYTHONPATH}"
cd "$site"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
# the device run's limit is 600 s: stop well before, with the JSON written after every model
timeout 540 python3 -m bench.gpu_check --out "$out" "$@" 2>&1 | tee "$outdir/gpu_check.log"
echo "results: $out"
