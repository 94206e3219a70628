"""Plots of bench.e2e results: throughput per workload and system, latency distributions.

python -m bench.plots bench/results/e2e.json   # draw again from a results file
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def plot(summary: dict, rounds: list[dict], out: Path, machine: dict) -> list[Path]:
    systems = list(summary)
    dtype = {"float32": "fp32", "bfloat16": "bf16"}.get(machine.get("dtype", "float32"), machine.get("dtype"))
    where = f"{machine['cpus']} CPU cores ({machine['processor']}), torch {machine['torch']}, {dtype}, all-MiniLM-L6-v2"
    paths = []

    throughput = [w for w in ("long", "medium") if w in summary[systems[0]]]
    if throughput:
        fig, ax = plt.subplots(figsize=(8, 4.5))
        width = 0.8 / len(systems)
        x = np.arange(len(throughput))
        for i, system in enumerate(systems):
            values = [summary[system][w]["tokens_per_s"] for w in throughput]
            bars = ax.bar(x + i * width, values, width, label=system)
            ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=7)
        ax.set_xticks(x + width * (len(systems) - 1) / 2, throughput)
        ax.set_ylabel("tokens/s (median of rounds)")
        ax.set_title(f"Throughput\n{where}", fontsize=9)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=2)
        ax.margins(y=0.12)
        fig.tight_layout()
        paths.append(out / "throughput.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)

    latency = [w for w in ("single", "many-singles") if w in summary[systems[0]]]
    http = [s for s in systems if "in-process" not in s]
    if latency and http:
        fig, axes = plt.subplots(1, len(latency), figsize=(5 * len(latency), 4), squeeze=False)
        for ax, w in zip(axes[0], latency):
            for system in http:
                lat = np.sort(np.concatenate([r[system][w]["latencies_ms"] for r in rounds]))
                ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), label=system)
            ax.set_xscale("log")
            ax.set_xlabel("latency (ms, log)")
            ax.set_ylabel("fraction of requests")
            ax.set_title(f"{w}: latency distribution", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(where, fontsize=8)
        fig.tight_layout()
        paths.append(out / "latency.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


if __name__ == "__main__":
    import json
    import sys

    source = Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/e2e.json")
    data = json.loads(source.read_text())
    for path in plot(data["summary"], data["rounds"], source.parent, data["machine"]):
        print(f"wrote {path}")
