"""bench.images_served's code path: embedfleet's half at the tiny shape (the figures come from running it with
infinity-emb beside it, docs/performance.md)."""

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_images_served_smoke_measures_every_process_and_checks_the_vectors(tmp_path):
    """--smoke: ``embedfleet up`` on a tiny CLIP folder whose tokenizer transformers' CLIPProcessor reads,
    images as data URIs in infinity-emb's form; images/s, latencies and CPU an image for every process, the
    served vectors equal to transformers' in-process ones."""
    out = tmp_path / "images_served.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.images_served", "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["shape"] == "tiny" and data["infinity_emb"] is None and "ratios" not in data
    assert set(data["systems"]) == {"embedfleet"}
    assert data["least_cosine"] == {"embedfleet / transformers": pytest.approx(1.0, abs=1e-4)}
    (window,) = data["systems"]["embedfleet"]["windows"]
    assert window["images"] > 0 and window["images"] == 3 * window["requests"]  # --per-request 3 in the smoke
    assert window["images_per_s"] > 0 and window["p99_ms"] >= window["p50_ms"] > 0
    cpu = window["cpu_ms_per_image"]
    assert {"nats-server", "gateway", "tokenizer", "worker", "scorer", "up", "client", "server"} == set(cpu)
    # every process an image passes through spends CPU on it; the server's figure is theirs added up
    assert all(cpu[p] > 0 for p in ("gateway", "tokenizer", "worker")), cpu
    assert cpu["server"] == pytest.approx(sum(v for p, v in cpu.items() if p not in ("server", "client")))
    assert re.search(r"^embedfleet +\d+\.\d +\d+\.\d +\d+\.\d +\d+\.\d\d", result.stdout, re.M), result.stdout
