"""The benchmarks' own code paths, at tiny sizes (figures come from running them for real)."""

import json
import subprocess
import sys


def test_engine_benchmark_prints_ratios_and_roofline():
    result = subprocess.run(
        [sys.executable, "-m", "bench.engine", "--rounds", "1", "--scale", "0.05"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.startswith(("long", "medium"))}
    assert set(rows) == {"long", "medium"}
    for row in rows.values():
        assert row[5].endswith("x") and float(row[5][:-1]) > 0  # engine / reference
        assert row[7].endswith("%")  # of the roofline
    assert "GEMM peak" in result.stdout


def test_gpu_check_script_runs_its_code_paths_on_cpu(tmp_path):
    out = tmp_path / "smoke.json"
    result = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--smoke", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["smoke"] is True
    assert data["correctness"]["tiny"]["min_cosine_eager_vs_cpu"] > 0.9999
    assert {(r["seq_len"], r["replicas"]) for r in data["throughput"]} == {(s, n) for s in (50, 512) for n in (1, 2, 4)}
    assert all(r["tokens_per_s"] > 0 for r in data["throughput"])
    assert data["saturation"]["knee"] in [b for b, _ in data["saturation"]["points"]]


def test_e2e_benchmark_runs_its_systems_and_writes_results(tmp_path):
    """bench.e2e at a tiny size: embedfleet as processes, the engine and sentence-transformers in-process."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.e2e", "--rounds", "1", "--seconds", "0.5", "--only", "single", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads((tmp_path / "e2e.json").read_text())
    assert set(data["summary"]) == {"engine in-process", "sentence-transformers in-process", "embedfleet"}
    single = data["summary"]["embedfleet"]["single"]
    assert single["requests_per_s"] > 0 and single["p99_ms"] >= single["p50_ms"] > 0
    assert "single: p50" in result.stdout


def test_e2e_queries_are_short_queries_as_the_performance_notes_define_them():
    """single / many singles: 15-20 tokens each (special tokens included), counted by the model's tokenizer."""
    from bench.e2e import QUERY_TOKENS, token_counts, workloads

    single = next(w for w in workloads() if w.name == "single")
    counts = token_counts(single.texts)
    assert len(single.texts) >= 200
    assert all(QUERY_TOKENS[0] <= counts[q] <= QUERY_TOKENS[1] for q in single.texts), sorted(counts.values())[-5:]
