"""What the CPU fabric costs per query, process by process, with a model whose forward pass costs
next to nothing (bert "fabric": hidden 32, one layer), served by the stack ``embedfleet up`` starts.

    python -m bench.fabric [--seconds 10] [--idle-seconds 20] [--reindex-docs 20000] [--infinity PATH] [--out DIR]
    python -m bench.fabric --rates-only --infinity PATH   # CPU a query at 50, 200, 1,000 q/s and flat out
    python -m bench.fabric --smoke      # every code path at tiny durations (the test)

Workloads, each after a warm-up: single queries over HTTP at 32 and 128 in flight, 8-input requests
(8 in flight), long documents (32 a request, 4 in flight), the same single queries through an
EmbedClient on NATS from this process (no HTTP), and a bulk ``embedfleet reindex`` as a process. For
each, the CPU (user + system, /proc) of nats-server, gateway, tokenizer, worker, scorer and up (its
supervisor), and of the client: this process, or the reindex process. Floors of the same run: a bare
starlette/uvicorn app answering an embeddings body, and HF tokenizers' encode_batch in-process.
Then the rates (bench/fabric_rates.py, with ``wrk``): single queries at 50, 200 and 1,000 queries a second
and flat out, CPU a query of every process, p50 and p99, embedfleet and infinity-emb side by side, the
ratio at each rate, and a plot (DIR/cpu_per_query.png, with matplotlib). Results go to DIR/fabric.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from bench import fabric_rates
from bench.e2e import Workload, drive_http, infinity_server, queries
from bench.fabric_floor import http_floor, tokenizer_floor
from bench.fabric_load import (
    ROLES,
    Meter,
    Stack,
    drive_nats,
    infinity_pid,
    run_reindex,
    self_seconds,
    tree_seconds,
    up_stack,
)
from bench.fabric_report import print_case, print_summary, summarize
from tests.support.corpus import long_texts, medium_texts, mixed_texts

H200_QUERIES = 28_000  # single queries/s one H200 serves (the figure the projection feeds)
H200_TOKENS = 1_400_000  # tokens/s


@dataclass(frozen=True)
class Case:
    name: str
    workload: Workload
    via: str  # "http" (the gateway) or "nats" (an EmbedClient in this process)
    unit: str  # what the CPU is divided by: "query", "request" or "1k tokens"
    path: tuple[str, ...]  # the processes every request goes through


HTTP_PATH = ("nats-server", "gateway", "tokenizer", "worker", "client")
NATS_PATH = ("nats-server", "tokenizer", "worker", "client")


def cases() -> list[Case]:
    qs = queries(mixed_texts(400))
    return [
        Case("single-32", Workload("single-32", qs, 1, 32), "http", "query", HTTP_PATH),
        Case("single-128", Workload("single-128", qs, 1, 128), "http", "query", HTTP_PATH),
        Case("medium-8", Workload("medium-8", medium_texts(1024), 8, 8), "http", "request", HTTP_PATH),
        Case("long", Workload("long", long_texts(512), 32, 4), "http", "1k tokens", HTTP_PATH),
        Case("nats-single-32", Workload("nats-single-32", qs, 1, 32), "nats", "query", NATS_PATH),
    ]


def token_counts(folder: Path, texts: list[str]) -> dict[str, int]:
    """Tokens of each text as the stack's tokenizer counts them (truncated at the folder's limit)."""
    from embedfleet.services.tokenizer.encoder import TextEncoder
    from embedfleet.shared.model_dir.load import load_model_info

    encoder = TextEncoder(load_model_info(str(folder)))
    return {t: len(ids) for t, ids in zip(texts, encoder.encode(texts))}


def run_case(stack: Stack, case: Case, args: argparse.Namespace, tokens: dict[str, int]) -> dict:
    """One workload: warm-up, then ``args.seconds`` measured; error answers counted (by HTTP status or
    error code), not raised: an overloaded stack is a finding, and the CPU is divided by the answers."""
    meter = Meter(stack)
    errors: Counter[int | str] = Counter()  # HTTP status, or the NATS error code
    if case.via == "nats":
        result = asyncio.run(drive_nats(stack, case.workload, args.seconds, args.warm_up, tokens, meter, errors))
    else:
        url = f"{stack.base}/v1/embeddings"
        asyncio.run(drive_http(url, case.workload, args.warm_up, tokens, stack.model, Counter()))
        meter.start()
        result = asyncio.run(drive_http(url, case.workload, args.seconds, tokens, stack.model, errors))
        result |= meter.stop()
    result.pop("latencies_ms")
    return summarize({**result, "errors": {str(k): n for k, n in errors.items()}}, case.unit, case.path)


def run_stack(folder: Path, args: argparse.Namespace, work: Path) -> dict:
    """Every workload on one ``up``, then the reindex, then the idle stack (up's output: OUT/up.log)."""
    out: dict = {"workloads": {}}
    # the smoke run skips the worker's start-up calibration (seconds of CPU that measure nothing here)
    environ = {"EMBEDFLEET_MAX_BATCH_TOKENS": "2048"} if args.smoke else None
    with up_stack(folder, work / "data", Path(args.out) / "up.log", environ=environ) as stack:
        if args.rates:
            bodies = fabric_rates.bodies_file(stack.model, cases()[0].workload.texts, work)
            out["rates"] = fabric_rates.curve(
                stack.base, "/v1/embeddings", bodies, stack.cpu, args.rates, args.seconds, args.warm_up
            )
            fabric_rates.print_curve("embedfleet", out["rates"])
        if args.rates_only:
            return out
        for case in cases():
            tokens = token_counts(folder, case.workload.texts)
            out["workloads"][case.name] = run_case(stack, case, args, tokens)
            print_case(case.name, out["workloads"][case.name])
        texts = medium_texts(args.reindex_docs)
        result = run_reindex(stack, texts, work)
        counts = token_counts(folder, texts)  # by text: the documents repeat the corpus's paragraphs
        result["tokens"] = sum(counts[t] for t in texts)
        result |= {
            "tokens_per_s": result["tokens"] / result["seconds"],
            "p50_ms": None,
            "p99_ms": None,
            "requests_per_s": result["documents"] / result["seconds"],
        }
        out["workloads"]["reindex"] = summarize(result, "1k tokens", ("nats-server", "tokenizer", "worker", "client"))
        print_case("reindex", out["workloads"]["reindex"])
        out["idle"] = idle(stack, args.idle_seconds)
    return out


def idle(stack: Stack, seconds: float) -> dict:
    """The stack's CPU seconds per minute with no traffic at all."""
    before = stack.cpu()
    time.sleep(seconds)
    after = stack.cpu()
    per_minute = {role: (after[role] - before[role]) * 60 / seconds for role in ROLES}
    return {"seconds": seconds, "cpu_s_per_minute": per_minute, "total_cpu_s_per_minute": sum(per_minute.values())}


def http_floor_figures(args: argparse.Namespace, work: Path, single: Workload, tokens: dict[str, int]) -> dict:
    """The bare HTTP app's CPU ms per request and the client's, singles at 32 in flight."""
    with http_floor(Path(args.out) / "floor.log") as (url, pid):
        asyncio.run(drive_http(url, single, args.warm_up, tokens))
        server, client = tree_seconds(pid), self_seconds()
        result = asyncio.run(drive_http(url, single, args.seconds, tokens))
        server, client = tree_seconds(pid) - server, self_seconds() - client
    n = max(result["requests"], 1)
    return {
        "requests_per_s": result["requests_per_s"],
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "server_cpu_ms_per_request": server * 1e3 / n,
        "client_cpu_ms_per_request": client * 1e3 / n,
    }


def floors(folder: Path, args: argparse.Namespace, work: Path) -> dict:
    single = cases()[0].workload
    seconds = min(args.seconds, 5.0)
    return {
        "http": http_floor_figures(args, work, single, token_counts(folder, single.texts)),
        # the long workload's texts, 32 a call as its requests carry them; and the reindex's documents
        "tokenizer_long": tokenizer_floor(folder, long_texts(512)[:128], 32, seconds),
        "tokenizer_reindex": tokenizer_floor(folder, medium_texts(min(args.reindex_docs, 2048)), 64, seconds),
    }


def classic_folder(folder: Path) -> None:
    """Write the folder's sentence-transformers configuration as published models have it
    (``sentence_transformers.models.Pooling``, ``pooling_mode_mean_tokens``), which every release of it
    reads: the release in infinity-emb's environment knows neither newer module paths nor newer keys."""
    modules = json.loads((folder / "modules.json").read_text())
    for module in modules:
        module["type"] = "sentence_transformers.models." + module["type"].rsplit(".", 1)[-1]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2))
    bert = json.loads((folder / "sentence_bert_config.json").read_text())
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": bert["max_seq_length"], "do_lower_case": False})
    )
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    modes = {
        "cls": "cls_token",
        "mean": "mean_tokens",
        "max": "max_tokens",
        "mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    }
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": pooling["embedding_dimension"],
                **{f"pooling_mode_{mode}": name == pooling["pooling_mode"] for name, mode in modes.items()},
            }
        )
    )


def infinity(folder: Path, args: argparse.Namespace, model: str) -> dict:
    """infinity-emb on the same folder: its whole process's CPU per unit, singles (32) and long."""
    out: dict = {}
    classic_folder(folder)
    with infinity_server(args.infinity, "float32", folder=folder, name=model) as url:
        pid = infinity_pid(args.infinity)
        if args.rates:
            bodies = fabric_rates.bodies_file(model, cases()[0].workload.texts, folder.parent)
            base = url.removesuffix("/v1/embeddings")
            out["rates"] = fabric_rates.curve(
                base,
                "/v1/embeddings",
                bodies,
                lambda: {"infinity-emb": tree_seconds(pid)},
                args.rates,
                args.seconds,
                args.warm_up,
            )
            fabric_rates.print_curve("infinity-emb", out["rates"])
        if args.rates_only:
            return out
        for case in (c for c in cases() if c.name in ("single-32", "long")):
            tokens = token_counts(folder, case.workload.texts)
            asyncio.run(drive_http(url, case.workload, args.warm_up, tokens, model))
            used = tree_seconds(pid)
            result = asyncio.run(drive_http(url, case.workload, args.seconds, tokens, model))
            result.pop("latencies_ms")
            result["cpu_s"] = {"infinity-emb": tree_seconds(pid) - used}
            out[case.name] = summarize(result, case.unit, ())
            print_case(f"infinity-emb {case.name}", out[case.name])
    return out


def ratios_and_projection(data: dict) -> tuple[dict, dict]:
    w, f = data["workloads"], data["floors"]
    ratios = {
        "gateway_over_http_floor": w["single-32"]["cpu_ms"]["gateway"] / f["http"]["server_cpu_ms_per_request"],
        "tokenizer_over_encode_batch_long": w["long"]["cpu_ms"]["tokenizer"]
        / f["tokenizer_long"]["cpu_ms_per_1k_tokens"],
        "reindex_all_over_encode_batch": w["reindex"]["cpu_ms"]["all"] / f["tokenizer_reindex"]["cpu_ms_per_1k_tokens"],
    }
    projection = {
        "single_queries_cores": w["single-32"]["cpu_ms"]["stack"] * H200_QUERIES / 1e3,
        "single_queries_cores_with_client": w["single-32"]["cpu_ms"]["all"] * H200_QUERIES / 1e3,
        "long_cores": w["long"]["cpu_ms"]["stack"] * H200_TOKENS / 1e6,
        "reindex_cores": w["reindex"]["cpu_ms"]["all"] * H200_TOKENS / 1e6,
    }
    return ratios, projection


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per workload")
    parser.add_argument("--warm-up", type=float, default=2.0, help="unmeasured seconds before each workload")
    parser.add_argument("--idle-seconds", type=float, default=20.0, help="seconds the idle stack is watched")
    parser.add_argument("--reindex-docs", type=int, default=20_000, help="documents of the bulk reindex")
    parser.add_argument(
        "--infinity",
        default=os.environ.get("EMBEDFLEET_BENCH_INFINITY"),
        help="infinity_emb command (its own venv); without it infinity-emb is left out",
    )
    parser.add_argument(
        "--rates",
        default=",".join(map(str, fabric_rates.RATES)),
        help="offered rates (q/s, comma-separated) of the rates' windows, each then flat out; 'none': none",
    )
    parser.add_argument("--rates-only", action="store_true", help="the rates alone (no other workload, floor or idle)")
    parser.add_argument("--out", default="bench/results", help="folder for fabric.json")
    parser.add_argument("--smoke", action="store_true", help="tiny durations: 2 s a workload, 500 documents, 2 s idle")
    args = parser.parse_args(argv)
    args.rates = () if args.rates == "none" else tuple(int(r) for r in args.rates.split(","))
    if args.rates and not fabric_rates.have_wrk():
        print("no wrk command (Debian's package wrk): the rates are left out", flush=True)
        args.rates = ()
    if args.smoke:
        # 2 s: a process's CPU is read in clock ticks (10 ms); on a loaded machine 1 s of single queries
        # once left nats-server under one tick
        args = argparse.Namespace(
            **{
                **vars(args),
                "seconds": 2.0,
                "warm_up": 0.3,
                "idle_seconds": 2.0,
                "reindex_docs": 500,
                "rates": (200,) if args.rates else (),  # one rate, then flat out
            }
        )
    return args


def main(argv: list[str] | None = None) -> None:
    from bench.families import describe, make_folder

    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-fabric-") as tmp:
        work = Path(tmp)
        folder = make_folder("bert", work, "fabric")
        print(f"model: {describe('bert', 'fabric')}", flush=True)
        data = {
            "model": describe("bert", "fabric"),
            "smoke": args.smoke,
            "cpus": os.cpu_count(),
            "seconds": args.seconds,
            **run_stack(folder, args, work),
        }
        if not args.rates_only:
            data["floors"] = floors(folder, args, work)
            data["ratios"], data["projection"] = ratios_and_projection(data)
        if args.infinity:
            data["infinity"] = infinity(folder, args, folder.name)
    if "rates" in data and "rates" in data.get("infinity", {}):
        data["rate_ratios"] = fabric_rates.ratios(data["rates"], data["infinity"]["rates"])
        fabric_rates.print_ratios(data["rate_ratios"])
    if "rates" in data:
        curves = {
            "embedfleet": data["rates"],
            **({"infinity-emb": data["infinity"]["rates"]} if "rate_ratios" in data else {}),
        }
        if (drawn := fabric_rates.plot(curves, out / "cpu_per_query.png")) is not None:
            print(f"plot: {drawn}")
    if not args.rates_only:
        print_summary(data)
    (out / "fabric.json").write_text(json.dumps(data, indent=1))
    print(f"\nwrote {out / 'fabric.json'}")


if __name__ == "__main__":
    main()
