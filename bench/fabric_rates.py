"""CPU per query at fixed offered rates, not only at saturation: single queries sent by ``wrk`` (a compiled
client: a few microseconds of CPU a request, against the Python clients' hundreds) at 50, 200 and 1,000
queries a second and flat out, to embedfleet's stack and to infinity-emb's server in turn, the CPU of every
process of each read from /proc over the window.

The rate is held open-loop within the latency of an answer: ``bench/wrk_paced.lua`` gives each connection an
exponential pause (mean 100 ms) after each answer, with ``rate x 0.1`` connections (at least 2, at most 128),
so arrivals are Poisson-like at the rate asked as long as answers take a few milliseconds (the rate achieved
is reported, and the CPU divided by the queries answered). Flat out: 32 connections, no pause.

Needs the ``wrk`` command (Debian's package ``wrk``); without it the rates are left out and said so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

RATES = (50, 200, 1000)
SATURATION = 0  # the rate that means flat out
PAUSE_S = 0.1  # each connection's mean pause after an answer
SCRIPT = Path(__file__).with_name("wrk_paced.lua")


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


def connections(rate: int) -> int:
    return 32 if rate == SATURATION else max(2, min(128, round(rate * PAUSE_S)))


def bodies_file(model: str, texts: list[str], folder: Path) -> Path:
    """The request bodies, one JSON a line (``{"model", "input"}``: OpenAI's and infinity-emb's form)."""
    name = re.sub(r"[^\w.-]", "_", model)
    path = folder / f"bodies-{name}.jsonl"
    path.write_text("".join(json.dumps({"model": model, "input": t}) + "\n" for t in texts))
    return path


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(value: str) -> float:
    """A wrk duration ("812.00us", "5.10ms", "1.02s", "1.00m") in milliseconds."""
    found = re.fullmatch(r"([\d.]+)([a-z]+)", value)
    if found is None or found.group(2) not in _UNITS:
        raise ValueError(f"not a wrk duration: {value!r}")
    return float(found.group(1)) * _UNITS[found.group(2)]


def run_wrk(base: str, path: str, bodies: Path, rate: int, seconds: float) -> dict:
    """One window of ``wrk`` at ``rate`` (0: flat out): queries answered, q/s, p50 and p99 in ms, errors."""
    env = {**os.environ, "RATE": str(rate), "CONNS": str(connections(rate)), "BODIES": str(bodies), "PATH_": path}
    command = ["wrk", "-t1", f"-c{connections(rate)}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(SCRIPT)]
    done = subprocess.run([*command, base], capture_output=True, text=True, env=env, timeout=seconds + 60)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")
    return {"offered_per_s": rate or None, **parse_wrk(done.stdout), "connections": connections(rate)}


def parse_wrk(out: str) -> dict:
    """wrk's report (with ``--latency``): queries answered, q/s, p50 and p99 in ms, errors. The percentiles are
    read from the latency distribution's own lines: the thread stats' "+/- Stdev" column holds percentages too
    ("78.50%"), which an unanchored "50%" would take."""
    answered = re.search(r"(\d+) requests in ([\d.]+[a-z]+)", out)
    p50 = re.search(r"^\s*50%\s+(\S+)$", out, re.MULTILINE)
    p99 = re.search(r"^\s*99%\s+(\S+)$", out, re.MULTILINE)
    if answered is None or p50 is None or p99 is None:
        raise RuntimeError(f"not a wrk report with --latency: {out[-2000:]}")
    took = _ms(answered.group(2)) / 1e3
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: (.*)", out)
    return {
        "queries": int(answered.group(1)),
        "queries_per_s": int(answered.group(1)) / took,
        "p50_ms": _ms(p50.group(1)),
        "p99_ms": _ms(p99.group(1)),
        "errors": int(bad.group(1)) if bad else 0,
        "socket_errors": socket_errors.group(1) if socket_errors else None,
    }


def curve(
    base: str,
    path: str,
    bodies: Path,
    cpu: Callable[[], dict[str, float]],
    rates: tuple[int, ...],
    seconds: float,
    warm_up: float,
) -> list[dict]:
    """For each rate (and flat out): ``run_wrk`` with the CPU seconds ``cpu()`` reads (by process) over its
    window, as milliseconds a query answered, each process and all together."""
    run_wrk(base, path, bodies, 200, max(1.0, warm_up))
    out = []
    for rate in (*rates, SATURATION):
        before = cpu()
        result = run_wrk(base, path, bodies, rate, seconds)
        after = cpu()
        n = max(1, result["queries"] - result["errors"])
        per = {role: (after[role] - before[role]) * 1e3 / n for role in after}
        out.append({**result, "cpu_ms": {**per, "all": sum(per.values())}})
    return out


def ratios(ours: list[dict], theirs: list[dict]) -> list[dict]:
    """embedfleet / infinity-emb at each rate: CPU a query, p50 and p99."""
    return [
        {
            "offered_per_s": a["offered_per_s"],
            "cpu": a["cpu_ms"]["all"] / b["cpu_ms"]["all"],
            "p50": a["p50_ms"] / b["p50_ms"],
            "p99": a["p99_ms"] / b["p99_ms"],
        }
        for a, b in zip(ours, theirs)
    ]


def print_curve(name: str, points: list[dict]) -> None:
    for p in points:
        rate = f"{p['offered_per_s']:>5} q/s" if p["offered_per_s"] else "flat out "
        parts = ", ".join(f"{k} {v:.3f}" for k, v in p["cpu_ms"].items() if k != "all" and v > 0.0005)
        print(
            f"  {name} {rate}: {p['queries_per_s']:7,.0f} q/s answered, CPU {p['cpu_ms']['all']:.3f} ms a query "
            f"({parts}), p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms"
            + (f", {p['errors']} errors" if p["errors"] else ""),
            flush=True,
        )


def print_ratios(points: list[dict]) -> None:
    for r in points:
        rate = f"{r['offered_per_s']} q/s" if r["offered_per_s"] else "flat out"
        print(
            f"  embedfleet / infinity-emb at {rate}: CPU a query {r['cpu']:.2f}x, p50 {r['p50']:.2f}x, p99 {r['p99']:.2f}x"
        )


def plot(data: dict, out: Path) -> Path | None:
    """CPU ms a query against the offered rate, each server (a PNG); None without matplotlib (the bench extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in data.items():
        paced = [p for p in points if p["offered_per_s"]]
        xs = [p["queries_per_s"] for p in paced] + [points[-1]["queries_per_s"]]
        ys = [p["cpu_ms"]["all"] for p in paced] + [points[-1]["cpu_ms"]["all"]]
        ax.plot(xs, ys, marker="o", label=name)
        ax.annotate("flat out", (xs[-1], ys[-1]), textcoords="offset points", xytext=(4, 6), fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("queries answered per second (log)")
    ax.set_ylabel("CPU ms a query, every process")
    ax.set_title("CPU a query against the rate: single queries, near-zero model, 2 cores", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
