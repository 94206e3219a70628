"""Bulk jobs of page images for a page model (ColQwen2) on real processes (a nats-server, a tokenizer and two
workers serving a tiny ColQwen2 folder, a gateway): docs/bulk-jobs.md's reindex of a folder of pages of many
sizes with --output multivector, run as typed, lands every page once with the vectors /embed_all answers for
the same file, a vector per token; a truncated file becomes a dead letter naming it while the others land;
POST /v1/jobs of inline pages and of a JSONL file's answers the same; a job asking dense vectors of a page
model is refused before anything is published; a worker SIGKILLed mid-job leaves each page stored once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest

from embedfleet.shared.nats.server import EmbeddedNats, free_port
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.integration.test_job_faults import _state, _stored_ids
from tests.support.image_files import data_uri, encoded, noise, noise_files, write_files
from tests.support.page_models import build_colqwen2
from tests.support.procs import Service, cli, job_finished, kill_and_replace, running, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
MODEL = "colqwen2"
SIDES = (24, 260)  # pixels a side: pages of 16 to 256 patches (4 to 64 image tokens), each its own grid
HOLD = ["--ack-wait", "4"]  # the batches a killed process held come back within seconds
MANY = 80  # the pages of the job killed mid-way
BATCH = 2  # pages a job batch in that job: 40 batches


@dataclass
class PageFleet:
    """The fleet's parts: its NATS server, the model folder it serves, the gateway's URL, the folder that holds
    the processes' logs and is the gateway's --jobs-dir, and the processes by name."""

    nats: EmbeddedNats
    model: Path
    base: str
    folder: Path
    services: dict[str, Service] = field(default_factory=dict)

    def start(self, name: str) -> Service:
        common = ["--nats", self.nats.url, "--model", str(self.model), "--model-name", MODEL, *HOLD]
        if name == "tokenizer":  # a few pages a token batch: a job batch is cut into several
            self.services[name] = Service("tokenizer", [*common, "--chunk-seqs", "3", "--bulk-ahead", "4"], self.folder)
        else:
            args = [*common, "--max-batch-tokens", "1024"]
            self.services[name] = Service("worker", args, self.folder, {"OMP_NUM_THREADS": "1"})
        return self.services[name]

    def reindex_args(self, source: Path, *args: str) -> list[str]:
        return ["reindex", str(source), "--nats", self.nats.url, "--model", MODEL, "--stall-timeout", "60", *args]

    def reindex(self, source: Path, *args: str, status: int = 0) -> str:
        """reindex of ``source`` run to its end, which must be ``status``: its output."""
        done = cli(self.reindex_args(source, "--quiet", *args), timeout=180)
        assert done.returncode == status, done.stdout + done.stderr + self.logs()
        return done.stdout + done.stderr

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{s.log()[-2500:]}" for n, s in self.services.items())

    def embed_all(self, files: list[bytes]) -> list[np.ndarray]:
        """The online path's token vectors of each file: /embed_all with {"image": data URI} items."""
        items = [{"image": data_uri(f)} for f in files]
        reply = httpx.post(f"{self.base}/embed_all", json={"model": MODEL, "inputs": items}, timeout=120)
        assert reply.status_code == 200, reply.text
        return [np.asarray(rows, np.float32) for rows in reply.json()]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[PageFleet]:
    folder = tmp_path_factory.mktemp("page-jobs")
    model = build_colqwen2(tmp_path_factory.mktemp("colqwen2-build"))
    port = free_port()
    with EmbeddedNats(folder / "nats") as server:
        built = PageFleet(server, model, f"http://127.0.0.1:{port}", folder)
        gateway = ["--nats", server.url, "--port", str(port), "--jobs-dir", str(folder), "--default-model", MODEL]
        built.services["gateway"] = Service("gateway", gateway, folder)
        for name in ("tokenizer", "worker-1", "worker-2"):
            built.start(name)
        with running(built.services, server.url, built.base, timeout=120):
            yield built


def _same_tokens(ours: list[np.ndarray], online: list[np.ndarray]) -> None:
    """Each page's vectors those of the online path: as many tokens, each at a cosine of 0.9999 or more."""
    assert len(ours) == len(online)
    for i, (mine, theirs) in enumerate(zip(ours, online)):
        assert mine.shape == theirs.shape and mine.shape[0] > 1, (i, mine.shape, theirs.shape)
        assert cosines(mine, theirs).min() >= COSINE_TOLERANCE, (i, cosines(mine, theirs).min())


def _npz_pages(out: Path) -> dict[str, np.ndarray]:
    """reindex's .npz of multi-vectors: id -> [tokens, dim], in the .ids.json's order."""
    saved = np.load(out)
    ids = json.loads(out.with_suffix(".ids.json").read_text())
    offsets = saved["offsets"]
    assert len(offsets) == len(ids) + 1 and len(set(ids)) == len(ids)
    return {d: saved["vectors"][offsets[i] : offsets[i + 1]] for i, d in enumerate(ids)}


def _pages_folder(root: Path, n: int, seed: int) -> dict[str, bytes]:
    """``n`` pages of noise of many sizes (PNG and JPEG) under ``root``, some in a sub-folder: id -> file."""
    files = noise_files(n, seed=seed, sides=SIDES)
    paths = write_files(root, files, [f"{'scans/' if i % 3 == 0 else ''}page{i:02d}" for i in range(n)])
    return {p.relative_to(root).as_posix(): data for p, (_, data) in zip(paths, files)}


def test_the_docs_example_reindexes_a_folder_of_pages(fleet, tmp_path):
    """docs/bulk-jobs.md's page model example, typed into a shell against this fleet (its NATS server given by
    the environment) in a folder holding ``pages/``: every page once, in the order of the paths, each
    page's vectors the online path's."""
    text = (ROOT / "docs" / "bulk-jobs.md").read_text()
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "--output multivector" in b]
    pages = _pages_folder(tmp_path / "pages", 20, seed=1)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "EMBEDFLEET_NATS_URL": fleet.nats.url,
        "PYTHONPATH": str(ROOT),
    }  # this checkout's embedfleet
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr + fleet.logs()
    assert "20 documents" in done.stdout + done.stderr, done.stdout + done.stderr
    got = _npz_pages(tmp_path / "pages.npz")
    assert list(got) == sorted(pages)
    _same_tokens(list(got.values()), fleet.embed_all([pages[d] for d in got]))
    first = sorted(pages)[0]
    assert f"{first} {got[first].shape[0]} 128" in done.stdout, done.stdout  # the example's last line


def test_a_truncated_page_is_a_dead_letter_naming_it_and_the_others_land(fleet, tmp_path):
    pages = _pages_folder(tmp_path / "pages", 5, seed=2)
    whole = encoded(noise(120, 90, np.random.default_rng(3)))
    (tmp_path / "pages" / "torn.png").write_bytes(whole[: len(whole) * 2 // 3])  # its header whole: accepted
    out = tmp_path / "torn.npz"
    job = "torn-pages"
    args = ("--output", "multivector", "--out", str(out), "--job-id", job, "--batch-size", "3")
    output = fleet.reindex(tmp_path / "pages", *args, status=1)
    assert json.loads(out.with_suffix(".failed.json").read_text()) == ["torn.png"], output
    state = job_finished(fleet.base, job, 60)
    assert (state["status"], state["done"], state["failed"]) == ("done_with_errors", 5, 1), state
    assert "document 'torn.png'" in " ".join(state["errors"]), state["errors"]
    assert [(d["stage"], d["documents"]) for d in state["dead"]] == [("tokenizer", 1)], state["dead"]
    got = _npz_pages(out)
    assert sorted(got) == sorted(pages)
    _same_tokens([got[d] for d in sorted(pages)], fleet.embed_all([pages[d] for d in sorted(pages)]))
    assert all(s.alive for s in fleet.services.values()), fleet.logs()


def test_jobs_over_http_inline_and_from_a_jsonl_file(fleet):
    """POST /v1/jobs of pages, inline data URIs and a JSONL file of paths in --jobs-dir: the results' lines
    hold a vector per token, the online path's."""
    rng = np.random.default_rng(4)
    files = [encoded(noise(w, h, rng)) for w, h in [(200, 60), (40, 40), (90, 250), (150, 150)]]
    inline = {"documents": [{"id": f"i{n}", "image": data_uri(f)} for n, f in enumerate(files)]}
    under = fleet.folder / "http"
    under.mkdir()
    for n, data in enumerate(files):
        (under / f"{n}.png").write_bytes(data)
    (under / "pages.jsonl").write_text(
        "".join(json.dumps({"id": f"f{n}", "image": f"{n}.png"}) + "\n" for n in range(4))
    )
    by_path = {"path": "http/pages.jsonl", "batch_size": 3}
    online = fleet.embed_all(files)
    for job, body, prefix in (("inline-pages", inline, "i"), ("path-pages", by_path, "f")):
        answer = httpx.post(f"{fleet.base}/v1/jobs", json={**body, "id": job, "output": "multivector"}, timeout=60)
        assert answer.status_code == 202, answer.text
        state = job_finished(fleet.base, job, 60)
        assert (state["status"], state["done"]) == ("done", 4), state
        results = httpx.get(f"{fleet.base}/v1/jobs/{job}/results", timeout=60)
        assert results.status_code == 200, results.text
        lines = [orjson.loads(line) for line in results.content.splitlines()]
        got = {line["id"]: np.asarray(line["vector"], np.float32) for line in lines}
        assert len(got) == len(lines) == 4
        _same_tokens([got[f"{prefix}{n}"] for n in range(4)], online)


def test_a_job_of_pages_asking_dense_vectors_is_refused_up_front(fleet, tmp_path):
    pages = _pages_folder(tmp_path / "pages", 2, seed=5)
    body = {"documents": [{"id": d, "image": data_uri(f)} for d, f in pages.items()]}
    refused = httpx.post(f"{fleet.base}/v1/jobs", json=body, timeout=60)  # output: dense, the default
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["message"] == f"{MODEL} makes no dense vectors (it makes: multivector)", error
    assert error.get("param") == "output", error
    output = fleet.reindex(tmp_path / "pages", "--out", str(tmp_path / "v.npy"), status=2)
    assert f"{MODEL} makes no dense vectors (it makes: multivector); nothing was published" in output, output
    sparse = fleet.reindex(tmp_path / "pages", "--out", str(tmp_path / "v.npz"), "--output", "sparse", status=2)
    assert "--output sparse: images make dense vectors only" in sparse, sparse


def test_pages_with_a_worker_killed_mid_job_land_once(fleet, tmp_path):
    """MANY pages, a worker SIGKILLed mid-job and started again: each page stored once in the results
    stream and written once, a sample's vectors the online path's."""
    pages = _pages_folder(tmp_path / "many", MANY, seed=6)
    job, out = "many-pages", tmp_path / "many.npz"
    args = ("--output", "multivector", "--out", str(out), "--job-id", job, "--batch-size", str(BATCH))
    command = fleet.reindex_args(tmp_path / "many", "--quiet", *args)
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedfleet.services.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def some_stored() -> bool:
        assert proc.poll() is None, proc.communicate()[0]
        return _state(fleet.nats.url, job).get("done", 0) >= 8

    try:
        wait_until(some_stored, 120, "pages stored")
        done = _state(fleet.nats.url, job)["done"]
        assert done < MANY, "the job ended before the fault: make it longer"
        kill_and_replace(
            fleet.services, "worker-1", fleet.start, lambda: _state(fleet.nats.url, job).get("done", 0) > done
        )
        output = proc.communicate(timeout=180)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, output + fleet.logs()
    assert f"{MANY} documents ({MANY} embedded in this run" in output, output
    stored = _stored_ids(fleet.nats.url, job)
    assert len(stored) == MANY and set(stored.values()) == {1}, Counter(stored.values())
    state = _state(fleet.nats.url, job)
    assert (state["status"], state["done"], state.get("failed", 0)) == ("done", MANY, 0), state
    got = _npz_pages(out)
    assert sorted(got) == sorted(pages)
    sample = sorted(pages)[::10]
    _same_tokens([got[d] for d in sample], fleet.embed_all([pages[d] for d in sample]))
    assert all(s.alive for s in fleet.services.values()), fleet.logs()
