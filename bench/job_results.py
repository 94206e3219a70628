"""Reading a large job's vectors back over HTTP: time, rate and the gateway's memory while it streams.

    python -m bench.job_results [--results 1000]   # results of 64 float32 rows of 384 dims each

A nats-server and a gateway as processes (no model is needed: the results are stored as a worker
stores them, then read back); ``GET /v1/jobs/{id}/results`` as NDJSON and as Parquet, the gateway's
resident memory polled from /proc while the answer streams in.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx
import nats
import numpy as np

from embedfleet.shared.jobs.bucket import update_state
from embedfleet.shared.jobs.streams import ensure_streams
from embedfleet.shared.nats.server import EmbeddedNats, free_port
from embedfleet.shared.nats.subjects import Subjects
from embedfleet.shared.protocol import JobResult, encode
from tests.support.waiting import wait_until

ROWS, DIM, JOB = 64, 384, "bench-results"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


async def store(url: str, results: int) -> None:
    """A finished job of ``results`` results in the results stream, and its record."""
    subjects = Subjects()
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        kv = await ensure_streams(js, subjects)
        rng = np.random.default_rng(0)
        for b in range(results):
            rows = rng.standard_normal((ROWS, DIM)).astype("<f4")
            result = JobResult(JOB, b, 0, [f"d{b}-{i}" for i in range(ROWS)], DIM, "f4", rows.tobytes(), 100)
            await js.publish(subjects.results(JOB), encode(result), headers={"Nats-Msg-Id": f"{JOB}:{b}"})
        await update_state(
            kv,
            JOB,
            lambda s: replace(
                s,
                model="bench",
                input="bench",
                documents=results * ROWS,
                batches=results,
                done=results * ROWS,
                status="done",
                embedding_type="float32",
                output="dense",
            ),
        )
    finally:
        await nc.close()


def read_back(base: str, pid: int, accept: str) -> dict:
    """One full read: bytes, seconds, seconds to the first bytes, the gateway's RSS at its peak."""
    started, size, first, peak = time.monotonic(), 0, 0.0, rss_mib(pid)
    with httpx.stream("GET", f"{base}/v1/jobs/{JOB}/results", headers={"accept": accept}, timeout=600) as r:
        r.raise_for_status()
        for chunk in r.iter_bytes():
            first = first or time.monotonic() - started
            size += len(chunk)
            peak = max(peak, rss_mib(pid))
    return {"bytes": size, "seconds": time.monotonic() - started, "first": first, "peak": peak}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=int, default=1000, help=f"stored results of {ROWS} documents each")
    results = parser.parse_args(argv).results
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
        asyncio.run(store(server.url, results))
        port = free_port()
        with open(Path(tmp) / "gateway.log", "wb") as log:
            gateway = subprocess.Popen(
                [sys.executable, "-m", "embedfleet.services.cli", "gateway", "--nats", server.url, "--port", str(port)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_until(lambda: _answers(f"{base}/v1/jobs/{JOB}"), 120, "the gateway")
            before = rss_mib(gateway.pid)
            docs = results * ROWS
            print(
                f"{docs} documents ({docs * DIM * 4 / 2**20:.0f} MiB of float32 vectors); gateway {before:.0f} MiB RSS idle"
            )
            for accept in ("application/x-ndjson", "application/vnd.apache.parquet"):
                m = read_back(base, gateway.pid, accept)
                print(
                    f"{accept:32} {m['bytes'] / 2**20:6.0f} MiB in {m['seconds']:5.1f} s "
                    f"({m['bytes'] / 2**20 / m['seconds']:4.0f} MiB/s), first bytes {m['first']:.2f} s, "
                    f"gateway peak {m['peak']:.0f} MiB RSS"
                )
        finally:
            gateway.terminate()
            gateway.wait(30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


if __name__ == "__main__":
    main()
