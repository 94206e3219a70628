"""``bench.fabric``'s figures: CPU per unit of work by process, and the tables and lines it prints."""

from __future__ import annotations

from bench.fabric_load import ROLES

PER_REQUEST = ("query", "request")  # units counted in requests; the others in thousands of tokens


def summarize(result: dict, unit: str, path: tuple[str, ...]) -> dict:
    """``result`` (a driver's: requests, tokens, ``cpu_s`` by process, ``forward_s``) with the CPU ms
    per ``unit`` of each process, of the stack's processes together ("stack") and of all ("all", the
    client included), each one's share of all, and the worker's time outside its forward passes."""
    units = result["requests"] if unit in PER_REQUEST else result["tokens"] / 1e3
    units = max(units, 1e-9)
    cpu_ms = {name: seconds * 1e3 / units for name, seconds in result["cpu_s"].items()}
    cpu_ms["stack"] = sum(ms for name, ms in cpu_ms.items() if name in ROLES)
    cpu_ms["all"] = cpu_ms["stack"] + cpu_ms.get("client", 0.0)
    if not any(name in ROLES for name in result["cpu_s"]):  # another server: its processes are the stack
        cpu_ms["stack"] = cpu_ms["all"] = sum(result["cpu_s"].values()) * 1e3 / units
    out = {
        **result,
        "unit": unit,
        "path": list(path),
        "cpu_ms": cpu_ms,
        "share": {name: ms / cpu_ms["all"] if cpu_ms["all"] else 0.0 for name, ms in cpu_ms.items()},
    }
    if "worker" in result["cpu_s"]:
        # forward time is wall time (a batch's launch to its result on the host): on a loaded machine
        # it counts waits for a core too, and CPU minus it can go below zero; the thread split cannot
        out["worker_host_ms"] = (result["cpu_s"]["worker"] - result["forward_s"]) * 1e3 / units
        out["worker_forward_ms"] = result["forward_s"] * 1e3 / units
        out["worker_loop_ms"] = result["worker_loop_s"] * 1e3 / units
        out["worker_engine_threads_ms"] = (result["cpu_s"]["worker"] - result["worker_loop_s"]) * 1e3 / units
    return out


def _rate(r: dict) -> str:
    latency = f"  p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms" if r.get("p50_ms") is not None else ""
    errors = ", ".join(f"{n} x {what}" for what, n in r.get("errors", {}).items())
    return f"{r['requests_per_s']:8.1f} req/s {r['tokens_per_s']:10,.0f} tok/s{latency}  ({r['seconds']:.1f} s)" + (
        f"  errors: {errors}" if errors else ""
    )


def print_case(name: str, r: dict) -> None:
    per = f"CPU ms per {r['unit']}"
    print(f"\n{name}: {_rate(r)}", flush=True)
    print(f"  {'process':12} {per:>22} {'share':>7}")
    for proc in (*ROLES, "client", "infinity-emb"):
        if proc in r["cpu_ms"]:
            print(f"  {proc:12} {r['cpu_ms'][proc]:22.3f} {r['share'][proc]:7.1%}")
    print(f"  {'stack':12} {r['cpu_ms']['stack']:22.3f} {r['share']['stack']:7.1%}   (every process but the client)")
    print(f"  {'all':12} {r['cpu_ms']['all']:22.3f} {1:7.0%}")
    if "worker_host_ms" in r:
        print(
            f"  worker: CPU {r['cpu_ms']['worker']:.3f} - forward {r['worker_forward_ms']:.3f} (wall, "
            f"embedfleet_worker_forward_seconds) = {r['worker_host_ms']:.3f} ms host; by thread: event loop "
            f"{r['worker_loop_ms']:.3f} ms, engine threads {r['worker_engine_threads_ms']:.3f} ms",
            flush=True,
        )


def print_summary(data: dict) -> None:
    f, ratios, p, idle = data["floors"], data["ratios"], data["projection"], data["idle"]
    print("\nfloors (same run)")
    print(
        f"  HTTP (starlette + uvicorn httptools, one 384-float answer, 32 in flight): "
        f"{f['http']['server_cpu_ms_per_request']:.3f} ms per request, client {f['http']['client_cpu_ms_per_request']:.3f} ms "
        f"({f['http']['requests_per_s']:.0f} req/s)"
    )
    for key, what in (
        ("tokenizer_long", "long texts, 32 a call"),
        ("tokenizer_reindex", "reindex documents, 64 a call"),
    ):
        print(
            f"  tokenizers encode_batch in-process, {what}: {f[key]['cpu_ms_per_1k_tokens']:.3f} ms per 1k tokens "
            f"(texts cut after their last kept token; whole texts: {f[key]['whole_texts_cpu_ms_per_1k_tokens']:.3f})"
        )
    print("ratios")
    print(f"  gateway / HTTP floor (single-32, per request):           {ratios['gateway_over_http_floor']:6.2f}x")
    print(
        f"  tokenizer process / encode_batch (long, per 1k tokens):  {ratios['tokenizer_over_encode_batch_long']:6.2f}x"
    )
    print(f"  reindex, all processes / encode_batch (per 1k tokens):   {ratios['reindex_all_over_encode_batch']:6.2f}x")
    print(
        f"idle ({idle['seconds']:.0f} s): {idle['total_cpu_s_per_minute']:.2f} CPU-s per minute ("
        + ", ".join(f"{k} {v:.2f}" for k, v in idle["cpu_s_per_minute"].items())
        + ")"
    )
    print("projection: cores to feed one H200")
    print(
        f"  single queries at 28,000/s: {p['single_queries_cores']:.1f} cores (stack), "
        f"{p['single_queries_cores_with_client']:.1f} with the HTTP client"
    )
    print(
        f"  1.4M tokens/s: long over HTTP {p['long_cores']:.1f} cores (stack); "
        f"reindex {p['reindex_cores']:.1f} cores (every process, the reindex client included)"
    )
    for name, r in data.get("infinity", {}).items():
        print(
            f"  infinity-emb {name}: {r['cpu_ms']['all']:.3f} CPU ms per {r['unit']} (whole process) against "
            f"embedfleet's {data['workloads'][name]['cpu_ms']['stack']:.3f} (stack)"
        )
