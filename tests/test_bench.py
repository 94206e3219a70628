"""The benchmarks' own code paths, at tiny sizes (figures come from running them for real)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.procs import wait_until

pytestmark = pytest.mark.slow


def _bench(module, argv: list[str], capsys) -> str:
    """What a benchmark's ``main`` prints, run in this process (sentence-transformers, the reference
    most of them import, is imported once per test process instead of once per benchmark)."""
    capsys.readouterr()
    module.main(argv)
    return capsys.readouterr().out


def test_engine_benchmark_prints_ratios_and_roofline(capsys):
    from bench import engine

    out = _bench(engine, ["--rounds", "1", "--scale", "0.02", "--peak-seconds", "0.05"], capsys)
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("long", "medium"))}
    assert set(rows) == {"long", "medium"}
    for row in rows.values():
        assert row[5].endswith("x") and float(row[5][:-1]) > 0  # engine / reference
        assert row[7].endswith("%")  # of the roofline
    assert "GEMM peak" in out


def test_engine_benchmark_builds_each_family_and_prints_its_ratios(capsys, hub_offline):
    """--family at the tiny shape: a folder per family, the same comparison, a ratio row per family and workload."""
    from bench import engine

    out = _bench(
        engine,
        [
            "--family",
            "mpnet",
            "--family",
            "qwen3",
            "--shape",
            "tiny",
            "--rounds",
            "1",
            "--scale",
            "0.05",
            "--peak-seconds",
            "0.05",
        ],
        capsys,
    )
    rows = {
        (line.split()[8], line.split()[0]): line.split()
        for line in out.splitlines()
        if line.startswith(("long", "medium"))
    }
    assert set(rows) == {(f, w) for f in ("mpnet", "qwen3") for w in ("long", "medium")}
    for row in rows.values():
        assert row[5].endswith("x") and float(row[5][:-1]) > 0  # engine / reference
        assert row[7].endswith("%") and float(row[7][:-1]) > 0  # of the roofline
        assert float(row[9]) > 0.9999  # the engine's vectors are the reference's
    # long documents are cut at the folders' 512-token limit, not the default model's 256
    assert int(rows[("mpnet", "long")][1]) > 256 * int(192 * 0.05)
    assert "== mpnet (tiny)" in out and "== qwen3 (tiny)" in out
    summary = out[out.index("summary:") :].splitlines()
    assert [line.split()[0] for line in summary[2:4]] == ["mpnet", "qwen3"]


def test_roofline_counts_the_linear_layers_and_the_keys_each_token_sees():
    """Grouped-query attention and gated MLPs counted from the model's own layers; windows and causality
    from each layer's mask."""
    from bench.engine import flops_per_token, keys_per_token
    from embedfleet.services.gpu_worker.engine.attention import AttnMask
    from embedfleet.services.gpu_worker.engine.models import gemma3
    from embedfleet.services.gpu_worker.engine.models.registry import build

    lengths = np.array([10, 10, 4])
    assert keys_per_token(lengths, AttnMask()) == (2 * 10 * 10 + 4 * 4) / 24
    assert keys_per_token(np.array([4]), AttnMask(causal=True)) == (1 + 2 + 3 + 4) / 4
    assert keys_per_token(np.array([5]), AttnMask(window=1)) == (2 + 3 + 3 + 3 + 2) / 5
    assert keys_per_token(np.array([5]), AttnMask(causal=True, window=1)) == (1 + 2 + 2 + 2 + 2) / 5

    # EmbeddingGemma-300m: q 768 -> 3 x 256, k and v 768 -> 256, o 768 -> 768, gate/up 768 -> 2 x 1152, down
    config = {
        "model_type": "gemma3_text",
        "hidden_size": 768,
        "num_hidden_layers": 6,
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "intermediate_size": 1152,
        "vocab_size": 1000,
        "sliding_window": 4,
        "query_pre_attn_scalar": 256,
        "use_bidirectional_attention": True,
    }
    model = build(gemma3.spec(config))
    per_layer = 768 * (768 + 256 + 256) + 768 * 768 + 768 * 2 * 1152 + 1152 * 768
    linear, attention = flops_per_token(model, np.array([10]))
    assert linear == 2 * per_layer * 6
    # five sliding layers see |i - j| <= 2 of 10 tokens, the sixth all 10
    sliding = keys_per_token(np.array([10]), AttnMask(window=2))
    assert attention == 4 * 3 * 256 * (5 * sliding + 10)


def test_gpu_check_script_runs_its_code_paths_on_cpu(tmp_path):
    """bench/gpu_check.sh as a GPU machine runs it (its python3, the tree copied with no install of the
    project), here with this environment's python3 and --smoke."""
    from bench.gpu_check import CHECKS

    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "OUT": str(tmp_path / "out"),
        "TMPDIR": str(tmp_path),
    }
    result = subprocess.run(
        ["bash", str(root / "bench" / "gpu_check.sh"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert data["smoke"] is True
    models = data["models"]
    assert set(models) == {c.name for c in CHECKS}
    assert {m["family"] for m in models.values()} == {
        "bert",
        "mpnet",
        "modernbert",
        "gte",
        "nomic_bert",
        "nomic_moe",
        "qwen3",
        "gemma3",
        "gemma2",
        "eurobert",
        "jina_v3",
        "jina_v5",
        "clip",
        "siglip",
        "siglip2",
        "colqwen2",
    }
    for name, model in models.items():
        assert "error" not in model, (name, model.get("error"))
        assert model["shape"] == "tiny" and model["attention"] == "sdpa" and model["graphs_possible"] is False
        floor = 0.9999 if model["dtype"] == "float32" else 0.99  # bfloat16 keeps 8 bits of mantissa
        if model["family"] == "colqwen2":  # a page model: queries and pages, a vector per token
            pages = model["pages"]
            assert pages["min_cosine_eager_vs_cpu"] > floor, (name, pages)
            assert pages["pages"]["rows"] == 8 and pages["pages"]["rows_per_s"] > 0, pages
            assert pages["queries"]["rows"] == 64 and pages["queries"]["tokens_per_s"] > 0, pages
            continue
        assert model["correctness"]["min_cosine_eager_vs_cpu"] > floor, name
        assert model["correctness"]["batches"] == 6
        replicas = (1, 2, 4) if name == "bert-base" else (1,)
        assert {(r["seq_len"], r["replicas"]) for r in model["throughput"]} == {
            (s, n) for s in (50, 512) for n in replicas
        }
        assert all(r["tokens_per_s"] > 0 for r in model["throughput"])
    assert models["gemma3"]["dtype"] == "float32" and models["gemma3-bf16"]["dtype"] == "bfloat16"
    assert len(models["jina-v3"]["adapters"]) == 5 and len(models["jina-v5"]["adapters"]) == 4
    assert models["eurobert"]["adapters"] == []
    for name in ("clip", "siglip"):  # the image towers: against the CPU engine, and images/s
        images = models[name]["images"]
        assert images["min_cosine_eager_vs_cpu"] > 0.9999 and images["batches"] == [1, 5, 16], (name, images)
        assert [r["graphs"] for r in images["throughput"]] == [False] and images["throughput"][0]["images_per_s"] > 0
    naflex = models["siglip2"]["images"]  # images at their own grids, eager: against the CPU engine, and images/s
    assert naflex["min_cosine_eager_vs_cpu"] > 0.9999 and len(naflex["grids"]) == 5, naflex
    assert [r["graphs"] for r in naflex["throughput"]] == [False] and naflex["throughput"][0]["images_per_s"] > 0
    assert "images" not in models["bert-base"]
    saturation = models["bert-base"]["saturation"]
    assert saturation["knee"] in [b for b, _ in saturation["points"]]


def test_e2e_benchmark_runs_its_systems_and_writes_results(tmp_path):
    """bench.e2e at a tiny size: embedfleet as processes, the engine and sentence-transformers in-process."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.e2e",
            "--rounds",
            "1",
            "--seconds",
            "0.5",
            "--only",
            "single",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads((tmp_path / "e2e.json").read_text())
    assert set(data["summary"]) == {"engine in-process", "sentence-transformers in-process", "embedfleet"}
    single = data["summary"]["embedfleet"]["single"]
    assert single["requests_per_s"] > 0 and single["p99_ms"] >= single["p50_ms"] > 0
    assert "single: p50" in result.stdout


def test_observed_fleet_scrapes_its_metrics_and_receives_its_spans_and_the_overhead_is_printed(capsys):
    """bench.e2e --observability's fleet: every service's metrics scraped, a span per stage of every
    request received (it was on), its CPU per request read; and the on / off ratios printed."""
    from bench.e2e import OBSERVED, Workload, observability_overhead, run_http, token_counts
    from bench.fleet import fleet, observation

    texts = ["a short query about observability", "another one"]
    w = Workload("single", texts, 1, 1)
    with observation(metrics=True, tracing=True) as watch:
        with fleet([["--threads", "1"]], [], watch=watch) as (base, _):
            result = run_http(f"{base}/v1/embeddings", [w], 1.0, token_counts(texts), watch.cpu_seconds)["single"]
            wait_until(lambda: watch.scrapes >= 2, 10, "two rounds of scrapes")
        requests = result["requests"]
        # each request: the gateway's, the tokenizer's and the worker's three spans (the warm-up's too)
        assert requests > 0 and watch.spans >= 5 * requests and result["cpu_ms_per_request"] > 0
    plain = {
        "single": {k: result[k] for k in ("tokens_per_s", "requests_per_s", "p50_ms", "p99_ms", "cpu_ms_per_request")}
    }
    observed = {"single": {**plain["single"], "tokens_per_s": plain["single"]["tokens_per_s"] / 2}}
    observability_overhead({"embedfleet": plain, OBSERVED: observed})
    line = next(s for s in capsys.readouterr().out.splitlines() if s.strip().startswith(OBSERVED))
    assert "tokens/s 0.500x" in line and "CPU per request 1.000x" in line


def test_e2e_queries_are_short_queries_as_the_performance_notes_define_them():
    """single / many singles: 15-20 tokens each (special tokens included), counted by the model's tokenizer."""
    from bench.e2e import QUERY_TOKENS, token_counts, workloads

    single = next(w for w in workloads() if w.name == "single")
    counts = token_counts(single.texts)
    assert len(single.texts) >= 200
    assert all(QUERY_TOKENS[0] <= counts[q] <= QUERY_TOKENS[1] for q in single.texts), sorted(counts.values())[-5:]


def test_outputs_benchmark_prints_ratios_for_sparse_and_multi_vector(capsys, hub_offline):
    from bench import outputs

    out = _bench(outputs, ["--rounds", "1", "--scale", "0.01"], capsys)
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("splade", "colbert"))}
    assert set(rows) == {"splade", "colbert"}, out
    for row in rows.values():
        assert float(row[4].rstrip("x")) > 0  # engine / reference
        assert row[5] == "True" and float(row[6]) >= 0.9999  # same nonzero set / shapes, least cosine


def test_stack_memory_benchmark_measures_engines_in_one_process():
    result = subprocess.run(
        [sys.executable, "-m", "bench.stack_memory", "--engines-in-one-process", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rss = [float(line.split()[-3]) for line in result.stdout.splitlines() if "MiB RSS" in line]
    assert len(rss) == 3 and rss[0] < rss[1] < rss[2]  # torch alone, then each engine adds its weights


def _quick_timing(module: str) -> subprocess.CompletedProcess:
    """``module``'s timings, one round of five calls (a smoke run), as it prints them."""
    result = subprocess.run(
        [sys.executable, "-m", module, "--rounds", "1", "--number", "5"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result


def test_protocol_benchmark_times_the_hot_messages():
    result = _quick_timing("bench.protocol")
    rows = {
        " ".join(line.split()[:2]): line.split()[2:]
        for line in result.stdout.splitlines()
        if line.startswith(("TokenChunk", "EmbedResult", "JobBatch"))
    }
    assert set(rows) == {"TokenChunk 32x128", "EmbedResult 32x384", "JobBatch 64"}
    assert all(float(row[-1]) > 0 for row in rows.values())  # µs (or, with msgspec, the ratio)


def test_nats_message_benchmark_prints_the_cpu_of_a_message():
    result = subprocess.run(
        [sys.executable, "-m", "bench.nats_message", "--messages", "400"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    match = re.match(r"([0-9.]+) us of CPU a message in nats-py, both ends \(400 messages of 300 bytes", result.stdout)
    assert match and float(match.group(1)) > 0, result.stdout


def test_job_results_benchmark_reads_a_job_back_in_both_forms():
    result = subprocess.run(
        [sys.executable, "-m", "bench.job_results", "--results", "20"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("1280 documents (2 MiB of float32 vectors)"), result.stdout
    rows = [line.split() for line in result.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["application/x-ndjson", "application/vnd.apache.parquet"], result.stdout
    assert all(float(row[1]) > 0 and float(row[-3]) > 0 for row in rows)  # MiB read, peak MiB RSS


def test_fabric_benchmark_measures_every_process_of_every_workload(tmp_path):
    """bench.fabric --smoke: up's stack on the near-zero model, each workload's CPU per unit by process
    (positive for every process its requests pass through), the floors, ratios, idle and projection."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.fabric", "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads((tmp_path / "fabric.json").read_text())
    workloads = data["workloads"]
    assert set(workloads) == {"single-32", "single-128", "medium-8", "long", "nats-single-32", "reindex"}
    processes = {"nats-server", "gateway", "tokenizer", "worker", "scorer", "up", "client"}
    for name, w in workloads.items():
        assert processes <= set(w["cpu_ms"]), name
        assert all(w["cpu_ms"][p] >= 0 for p in processes), (name, w["cpu_ms"])
        assert w["path"] and all(w["cpu_ms"][p] > 0 for p in w["path"]), (name, w["cpu_ms"])
        assert w["cpu_ms"]["all"] >= w["cpu_ms"]["stack"] > 0 and w["tokens_per_s"] > 0
        assert w["worker_loop_ms"] > 0 and w["worker_forward_ms"] > 0
    assert "gateway" not in workloads["nats-single-32"]["path"]
    assert workloads["reindex"]["documents"] == 500 and workloads["long"]["unit"] == "1k tokens"
    assert data["floors"]["http"]["server_cpu_ms_per_request"] > 0
    assert data["floors"]["tokenizer_long"]["cpu_ms_per_1k_tokens"] > 0
    assert set(data["ratios"]) == {
        "gateway_over_http_floor",
        "tokenizer_over_encode_batch_long",
        "reindex_all_over_encode_batch",
    } and all(v > 0 for v in data["ratios"].values())
    assert all(v > 0 for v in data["projection"].values()) and len(data["projection"]) == 4
    # an idle stack may spend less than a clock tick (10 ms) of CPU in the smoke's 2 s: zero is a figure
    idle = data["idle"]
    assert idle["seconds"] == 2.0 and {"nats-server", "gateway", "tokenizer", "worker", "scorer"} <= set(
        idle["cpu_s_per_minute"]
    )
    assert all(v >= 0 for v in idle["cpu_s_per_minute"].values())
    assert idle["total_cpu_s_per_minute"] == pytest.approx(sum(idle["cpu_s_per_minute"].values()))
    assert "projection: cores to feed one H200" in result.stdout and "gateway / HTTP floor" in result.stdout
    # the rates (with wrk): one offered rate, then flat out, each answered by every process of the path
    if shutil.which("wrk") is None:
        assert "rates" not in data and "no wrk command" in result.stdout
        return
    paced, flat = data["rates"]
    assert paced["offered_per_s"] == 200 and flat["offered_per_s"] is None and flat["connections"] == 32
    for point in (paced, flat):
        assert point["queries"] > 0 and point["errors"] == 0 and 0 < point["p50_ms"] <= point["p99_ms"]
        assert all(point["cpu_ms"][p] > 0 for p in ("nats-server", "gateway", "tokenizer", "worker"))
    assert "embedfleet   200 q/s" in result.stdout and "embedfleet flat out" in result.stdout


def test_chunking_benchmark_measures_each_mode_against_truncation(tmp_path, capsys):
    """bench.chunking --smoke: the same documents truncated, cut into chunks and averaged, on one stack;
    chunks cover every token of a document, so they embed more tokens and make more vectors than
    truncation, and the mean makes one vector a document; late chunking a vector a chunk too."""
    from bench import chunking

    out = _bench(chunking, ["--smoke", "--out", str(tmp_path)], capsys)
    data = json.loads((tmp_path / "chunking.json").read_text())
    modes = data["modes"]
    assert set(modes) == {"truncate", "chunks", "mean", "late"}, data["refused"]
    for mode, s in modes.items():
        assert s["documents_per_s"] > 0 and s["embedded_tokens_per_s"] > 0, mode
    per_doc = {m: s["vectors_per_s"] / s["documents_per_s"] for m, s in modes.items()}
    assert per_doc["truncate"] == pytest.approx(1) and per_doc["mean"] == pytest.approx(1)
    assert per_doc["chunks"] > 2 and per_doc["late"] > 2  # ~1,000-token documents in 128-token chunks
    tokens_per_doc = {m: s["embedded_tokens_per_s"] / s["documents_per_s"] for m, s in modes.items()}
    assert tokens_per_doc["chunks"] > 2 * tokens_per_doc["truncate"]  # truncation embeds 256 a document
    assert "docs/s vs truncate" in out and re.search(r"^chunks .* 0\.\d\dx$", out, re.M)


def test_sinks_benchmark_measures_every_sink_and_both_search_modes(tmp_path, capsys, hub_offline):
    """bench.sinks --smoke: the same job into Parquet, pgvector, LanceDB and Qdrant's local mode, each
    sink's own write timed apart, and searches with and without rerank on the pgvector and LanceDB tables."""
    from bench import sinks

    out = _bench(sinks, ["--smoke", "--out-dir", str(tmp_path)], capsys)
    data = json.loads((tmp_path / "sinks.json").read_text())
    rows = {r["sink"]: r for r in data["table"]}
    assert list(rows) == ["parquet", "pgvector", "lancedb", "qdrant"]
    for sink, r in rows.items():
        assert r["job_rows_per_s"] > 0 and r["store_rows_per_s"] > 0 and r["index_build_s"] >= 0, sink
        assert r["store_small_rows_per_s"] > 0, sink
        assert r["job_vs_parquet"] > 0 and r["store_vs_parquet"] > 0, sink
    assert rows["parquet"]["job_vs_parquet"] == pytest.approx(1) and rows["pgvector"]["index_build_s"] > 0
    assert all(data["jobs"][s]["rows"] == data["documents"] for s in ("pgvector", "lancedb", "qdrant"))
    cells = {(s["store"], s["mode"], s["concurrency"]): s for s in data["search"].values()}
    assert set(cells) == {
        (store, mode, c) for store in ("pgvector", "lancedb") for mode in ("plain", "rerank") for c in (2,)
    }
    for key, s in cells.items():
        assert s["searches"] > 0 and s["p99_ms"] >= s["p50_ms"] > 0 and s["searches_per_s"] > 0, key
    assert data["top_k"] == 20 and "tiny random BERT cross-encoder" in data["reranker"]
    for sink in rows:
        assert re.search(rf"^{sink} +[0-9.]+ +[0-9.]+x +[0-9]+ +[0-9.]+x", out, re.M), out
    assert "reranked (top_n 10) by the tests' tiny" in out and "no Qdrant server installs here" in out


def test_body_parsing_benchmark_times_each_parser_on_each_body():
    result = _quick_timing("bench.body_parsing")
    # /v1/embeddings' table, then each other route's under its title
    openai, *titled = result.stdout.strip().split("\n\n")
    tables = {"/v1/embeddings": openai} | dict(t.split("\n", 1) for t in titled)
    names = {
        "/v1/embeddings": {"one query", "8 inputs", "every field"},
        "/v2/embed (Cohere)": {"query", "8 documents"},
        "/embed (TEI)": {"one query", "8 inputs", "every field"},
        "/v1/jobs": {"1 document", "1000 docs", "every field"},
    }
    assert set(tables) == set(names), set(tables)
    for title, table in tables.items():
        rows = {line[:12].strip(): line[12:].split() for line in table.strip().splitlines()[1:]}
        assert set(rows) == names[title], (title, set(rows))
        # bytes, then µs for hand, pydantic, the pydantic model alone (and msgspec), then the ratios
        assert all(float(row[1]) > 0 and float(row[2]) > 0 and "pydantic" in row for row in rows.values()), title


def test_a_family_transformers_lacks_is_written_by_the_engines_model_under_the_published_names(tmp_path, monkeypatch):
    """The GPU machine's transformers has no GteConfig: the GPU check's GTE folder is then written from
    the engine's model, with the tensor names and shapes transformers' GteModel saves."""
    from safetensors import safe_open

    from bench import families

    def tensors(folder):
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118 (a safe_open handle is no dict)

    published = families.make_folder("gte", tmp_path / "hf", "tiny", reference=False)
    # as if absent (deleted, the module would import it again); saving a model may have put another
    # module object in sys.modules' place: the one make_folder imports
    monkeypatch.setattr(sys.modules["transformers"], "GteConfig", None)
    with pytest.raises(RuntimeError, match="has no GteConfig"):  # a reference folder needs transformers' model
        families.make_folder("gte", tmp_path / "reference", "tiny", reference=True)
    written = families.make_folder("gte", tmp_path / "engine", "tiny", reference=False)
    assert "transformers_version" not in json.loads((written / "config.json").read_text())  # not saved by it
    assert tensors(written) == tensors(published)


@pytest.mark.parametrize("family", ["clip", "colqwen2"])
def test_images_benchmark_prints_ratios_for_each_stage(tmp_path, family):
    """bench.images at a tiny size: both stages timed side by side, the pixels and vectors compared (a two-tower
    model's images, a page model's pages)."""
    out = tmp_path / "images.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "bench.images", "--family", family, "--shape", "tiny"),
            *("--images", "6", "--batch", "3", "--rounds", "1", "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["max_abs_pixel_difference"] <= 1e-5 and data["least_cosine"] >= 0.9999, data
    for stage in ("prepare", "forward"):
        s = data["stages"][stage]
        assert s["speed_ratio"] > 0 and s["cpu_ratio"] > 0, s
        assert s["embedfleet"]["images_per_s"] > 0 and s["transformers"]["cpu_ms_per_image"] > 0, s
        assert re.search(rf"^{stage} .* \d+\.\d\dx .* \d+\.\d\dx$", result.stdout, re.M), result.stdout


WRK_REPORT = """Running 10s test @ http://127.0.0.1:8080
  1 threads and 20 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     4.54ms    1.22ms  20.10ms   78.50%
    Req/Sec   196.02     20.51   250.00     68.50%
  Latency Distribution
     50%    4.54ms
     75%    5.10ms
     90%    6.01ms
     99%   10.16ms
  1960 requests in 10.01s, 1.20MB read
  Non-2xx or 3xx responses: 3
Requests/sec:    195.80
Transfer/sec:    122.50KB
"""


def test_wrk_reports_are_read_from_their_latency_distribution():
    """The thread stats' "+/- Stdev" column ends in "50%" now and then ("68.50%", the line before "Latency
    Distribution"): the percentiles come from the distribution's own lines, not from the first "50%"."""
    from bench.fabric_rates import parse_wrk

    got = parse_wrk(WRK_REPORT)
    assert (got["queries"], got["p50_ms"], got["p99_ms"], got["errors"]) == (1960, 4.54, 10.16, 3)
    assert got["queries_per_s"] == pytest.approx(1960 / 10.01)
    with pytest.raises(RuntimeError, match="--latency"):
        parse_wrk(WRK_REPORT.replace("     99%   10.16ms\n", ""))
