"""Bulk jobs of images on real processes (a nats-server, a tokenizer and two workers serving a tiny CLIP
folder, a gateway), a real PostgreSQL with pgvector and LanceDB on disk, against transformers' CLIPModel
on the processor's pixels of the same files: reindex of a folder, of JSONL (paths and data URIs) and of
Parquet (the files' bytes); POST /v1/jobs inline and from --jobs-dir (a path escaping it refused); 500
images with a worker, then the tokenizer, SIGKILLed mid-job, each image once in pgvector and in LanceDB;
/v1/search of a text over the LanceDB table ranked as CLIP's text-image cosine; hostile image documents
refused at submission where their headers show it, else dead letters naming them, no process harmed."""

from __future__ import annotations

import io
import json
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
from PIL import Image

from embedfleet.services.gpu_worker.bulk import CRASH_AFTER_STORE
from embedfleet.shared.nats.server import EmbeddedNats, free_port
from tests.conftest import COSINE_TOLERANCE, cosines
from tests.integration.test_job_faults import _state, _stored_ids, _wait_mid_job
from tests.integration.test_job_sinks import _pg_rows
from tests.support.image_files import (
    animated_gif,
    clip_file_vectors,
    clip_reference,
    data_uri,
    encoded,
    huge_png_header,
    noise,
    noise_files,
    write_files,
)
from tests.support.image_models import PROJECTION, build_clip
from tests.support.procs import (
    Service,
    count_services,
    job_finished,
    kill_and_replace,
    running,
    stop_all,
    wait_until,
)

pytestmark = pytest.mark.integration

MODEL = "clip"
MANY = 500  # the images of the job killed mid-way
BATCH = 4  # images a job batch in that job: ~125 batches, long enough to be killed in the middle
HOLD = ["--ack-wait", "4"]  # the batches a killed process held come back within seconds


@dataclass
class ImageFleet:
    folder: Path  # also the gateway's --jobs-dir
    nats: EmbeddedNats
    clip: Path
    pg_uri: str
    services: dict[str, Service] = field(default_factory=dict)
    base: str = ""

    @property
    def lance(self) -> Path:
        return self.folder / "lance"

    def start(self, name: str, env: dict[str, str] | None = None) -> Service:
        common = ["--nats", self.nats.url, "--model", str(self.clip), "--model-name", MODEL, *HOLD]
        if name == "tokenizer":
            args = [*common, "--chunk-seqs", "16", "--bulk-ahead", "4"]
            self.services[name] = Service("tokenizer", args, self.folder)
        else:
            args = [*common, "--max-batch-tokens", "1024"]
            self.services[name] = Service("worker", args, self.folder, {"OMP_NUM_THREADS": "1", **(env or {})})
        return self.services[name]

    def reindex(self, source: Path, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "embedfleet.services.cli", "reindex", str(source), "--nats", self.nats.url),
                *("--model", MODEL, "--quiet", "--stall-timeout", "60", *args),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def finished(self, proc: subprocess.Popen, status: int = 0) -> str:
        try:
            output = proc.communicate(timeout=180)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"reindex did not finish\n{self.logs()}") from None
        assert proc.returncode == status, output + self.logs()
        return output

    def post(self, body: dict) -> httpx.Response:
        return httpx.post(f"{self.base}/v1/jobs", json={"model": MODEL, **body}, timeout=60)

    def results(self, job: str) -> dict[str, np.ndarray]:
        """A finished job's vectors, as GET /v1/jobs/{id}/results streams them: id -> vector, each once."""
        lines = [
            orjson.loads(line)
            for line in httpx.get(f"{self.base}/v1/jobs/{job}/results", timeout=60).content.splitlines()
        ]
        vectors = {line["id"]: np.asarray(line["vector"], np.float32) for line in lines}
        assert len(vectors) == len(lines), "an id twice"
        return vectors

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{s.log()[-2500:]}" for n, s in self.services.items())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, postgres_uri) -> Iterator[ImageFleet]:
    folder = tmp_path_factory.mktemp("image-jobs")
    server = EmbeddedNats(folder / "nats")
    server.start()
    built = ImageFleet(
        folder, server, build_clip(tmp_path_factory.mktemp("clip-build"), shortest_edge=40), postgres_uri
    )
    port = free_port()
    built.base = f"http://127.0.0.1:{port}"
    try:
        for name in ("tokenizer", "worker-1", "worker-2"):
            built.start(name)
        built.services["gateway"] = Service(
            "gateway",
            [
                *("--nats", server.url, "--port", str(port), "--jobs-dir", str(folder), "--default-model", MODEL),
                *("--job-sinks", f"{postgres_uri},lancedb://{built.lance}", "--search-model", MODEL),
                *("--search-sink", f"lancedb://{built.lance}?table=many_lance"),
            ],
            folder,
        )
        with running(built.services, server.url, built.base, timeout=120):
            yield built
    finally:
        stop_all(built.services)
        server.stop()


@pytest.fixture(scope="module")
def reference(fleet):
    return clip_reference(fleet.clip)


@pytest.fixture(scope="module")
def many(fleet) -> tuple[Path, list[str], list[bytes]]:
    """MANY pictures of noise, 16 to 40 pixels a side, PNG and JPEG, in sub-folders: (the folder, the
    ids a folder job gives them, in order, and their files)."""
    files = noise_files(MANY, seed=7)
    folder = fleet.folder / "many"
    paths = write_files(folder, files, [f"part{i % 4}/img{i:03d}" for i in range(MANY)])
    order = sorted(range(MANY), key=lambda i: paths[i].relative_to(folder).as_posix())
    return folder, [paths[i].relative_to(folder).as_posix() for i in order], [files[i][1] for i in order]


def _near(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.shape == theirs.shape and ours.shape[1] == PROJECTION, (ours.shape, theirs.shape)
    assert cosines(ours, theirs).min() >= COSINE_TOLERANCE, cosines(ours, theirs).min()


def test_reindex_a_folder_of_images(fleet, reference, tmp_path):
    """A folder of PNG and JPEG files (upper-case suffixes and a sub-folder too; other files are no
    documents): one document an image, its path its id, in the order of the paths."""
    files = noise_files(12, seed=1)
    names = [f"{'sub/' if i % 2 else ''}pic{i:02d}" for i in range(12)]
    paths = write_files(tmp_path / "pictures", files, names)
    paths[0].rename(paths[0].with_suffix(".PNG"))
    (tmp_path / "pictures" / "notes.csv").write_text("not,an,image\n")
    out = tmp_path / "vectors.npy"
    output = fleet.finished(fleet.reindex(tmp_path / "pictures", "--out", str(out), "--batch-size", "5"))
    assert "12 documents" in output, output
    ids = json.loads(out.with_suffix(".ids.json").read_text())
    by_name = {p.relative_to(tmp_path / "pictures").as_posix(): data for p, (_, data) in zip(paths, files)}
    by_name["pic00.PNG"] = by_name.pop("pic00.png")
    assert ids == sorted(by_name)
    _near(np.load(out), clip_file_vectors(reference, [by_name[i] for i in ids]))


def test_reindex_jsonl_of_paths_and_data_uris_and_parquet_of_bytes(fleet, reference, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = [data for _, data in noise_files(6, seed=2)]
    (tmp_path / "img").mkdir()
    for i, data in enumerate(files[:4]):
        (tmp_path / "img" / f"{i}.png").write_bytes(data)
    lines = [
        {"id": "relative", "image": "img/0.png", "lang": "en"},
        {"id": "absolute", "image": str(tmp_path / "img" / "1.png")},
        {"id": "uri", "image": data_uri(files[4])},
        {"id": 7, "image": "./img/3.png"},
    ]
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "jsonl.parquet"
    fleet.finished(fleet.reindex(docs, "--out", str(out)))
    table = pq.read_table(out)
    assert table["id"].to_pylist() == ["relative", "absolute", "uri", "7"]
    _near(
        np.array(table["vector"].to_pylist(), np.float32),
        clip_file_vectors(reference, [files[0], files[1], files[4], files[3]]),
    )

    parquet = tmp_path / "bytes.parquet"
    pq.write_table(pa.table({"id": ["p0", "p1", "p2"], "image": pa.array(files[3:], pa.binary())}), parquet)
    out = tmp_path / "parquet.npy"
    fleet.finished(fleet.reindex(parquet, "--out", str(out)))
    assert json.loads(out.with_suffix(".ids.json").read_text()) == ["p0", "p1", "p2"]
    _near(np.load(out), clip_file_vectors(reference, files[3:]))


def test_jobs_over_http_inline_and_from_the_jobs_folder(fleet, reference):
    files = [data for _, data in noise_files(5, seed=3, sides=(20, 36))]
    inline = fleet.post(
        {
            "id": "inline-images",
            "documents": [{"id": f"i{n}", "image": data_uri(f, "image/png")} for n, f in enumerate(files[:2])],
        }
        | {"batch_size": 1}
    )
    assert inline.status_code == 202, inline.text
    under = fleet.folder / "http"
    under.mkdir()
    for n, data in enumerate(files):
        (under / f"{n}.img").write_bytes(data)  # a name without an image suffix: the bytes say what it is
    (under / "job.jsonl").write_text("".join(json.dumps({"id": f"f{n}", "image": f"{n}.img"}) + "\n" for n in range(5)))
    by_path = fleet.post({"id": "path-images", "path": "http/job.jsonl"})
    assert by_path.status_code == 202, by_path.text
    for job, count in (("inline-images", 2), ("path-images", 5)):
        state = job_finished(fleet.base, job, 60)
        assert (state["status"], state["done"]) == ("done", count), state
    got = fleet.results("inline-images")
    _near(np.stack([got["i0"], got["i1"]]), clip_file_vectors(reference, files[:2]))
    assert job_finished(fleet.base, "inline-images")["batches"] == 2
    got = fleet.results("path-images")
    _near(np.stack([got[f"f{n}"] for n in range(5)]), clip_file_vectors(reference, files))

    outside = fleet.folder.parent / "outside.png"
    outside.write_bytes(files[0])
    escapes = {
        "escape.jsonl": "../../outside.png",
        "absolute.jsonl": str(outside),
        "linked.jsonl": "link.png",
    }
    (under / "link.png").symlink_to(outside)
    for name, image in escapes.items():
        (under / name).write_text(json.dumps({"id": "x", "image": image}) + "\n")
        refused = fleet.post({"path": f"http/{name}"})
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]["message"]
        assert "outside the jobs folder" in message and "document 'x'" in message, message
        assert str(fleet.folder) not in message.replace(str(outside), ""), message  # no server folder shown
    refused = fleet.post({"path": "../outside.png"})
    assert refused.status_code == 400 and "inside the jobs folder" in refused.json()["error"]["message"]


def _pg_ids(uri: str, table: str) -> list[str]:
    return [r[0] for r in _pg_rows(uri, table)]


def _lance_rows(path: Path, table: str) -> list[dict]:
    import lancedb

    return lancedb.connect(str(path)).open_table(table).to_arrow().to_pylist()


@pytest.mark.parametrize("victim", ["worker-1", "tokenizer"])
def test_images_killed_mid_job_land_once_in_the_store(fleet, reference, many, victim):
    """MANY images into pgvector (a worker SIGKILLed mid-job, and a third one exiting right after it
    stored its first result, before counting it: that batch comes back after --ack-wait, is stored again
    as a duplicate and counted once) and into LanceDB (the tokenizer SIGKILLed mid-job): each image
    once in the store and in the results stream, the vectors CLIP's."""
    folder, ids, files = many
    store = "pgvector" if victim.startswith("worker") else "lancedb"
    job = f"many_{'pg' if store == 'pgvector' else 'lance'}"
    sink = f"{fleet.pg_uri}&table={job}&index=none" if store == "pgvector" else f"lancedb://{fleet.lance}?table={job}"
    crasher = None
    if store == "pgvector":
        crasher = fleet.start("crasher", {CRASH_AFTER_STORE: "1"})
        del fleet.services["crasher"]  # not one of the fleet's: it dies on its own
        wait_until(lambda: count_services(fleet.nats.url, "worker") == 3, 60, "the third worker", [crasher])
    proc = fleet.reindex(folder, "--sink", sink, "--batch-size", str(BATCH), "--job-id", job)
    try:
        done = _wait_mid_job(fleet, job, proc, MANY)  # 64 images stored: some 16 batches in
        kill_and_replace(fleet.services, victim, fleet.start, lambda: _state(fleet.nats.url, job).get("done", 0) > done)
        output = fleet.finished(proc)
    finally:
        proc.kill()
        if crasher is not None:
            crasher.kill()
    if crasher is not None:
        assert crasher.proc.returncode == 70, crasher.log()[-2000:]  # it died after a store, mid-job
    # the crasher's batch is counted when it comes back (--ack-wait), maybe after reindex read it all
    wait_until(lambda: _state(fleet.nats.url, job).get("done") == MANY, 30, "every image counted")
    assert f"({MANY} rows)" in output, output
    rows = _pg_ids(fleet.pg_uri, job) if store == "pgvector" else [r["id"] for r in _lance_rows(fleet.lance, job)]
    assert len(rows) == MANY and sorted(rows) == sorted(ids), Counter(Counter(rows).values())
    stored = _stored_ids(fleet.nats.url, job)
    assert len(stored) == MANY and set(stored.values()) == {1}, Counter(stored.values())
    state = _state(fleet.nats.url, job)
    assert (state["status"], state["done"], state.get("failed", 0), state["sink_rows"]) == ("done", MANY, 0, MANY), (
        state
    )
    if store == "lancedb":
        vectors = {r["id"]: np.asarray(r["vector"], np.float32) for r in _lance_rows(fleet.lance, job)}
    else:
        vectors = {r[0]: r[1] for r in _pg_rows(fleet.pg_uri, job)}
    sample = list(range(0, MANY, 10))
    _near(np.stack([vectors[ids[i]] for i in sample]), clip_file_vectors(reference, [files[i] for i in sample]))
    assert all(s.alive for s in fleet.services.values()), fleet.logs()


QUERIES = ["a photo of a cat", "noise", "a red square on a white wall"]


def test_a_text_query_finds_images_in_the_order_of_clips_cosine(fleet, reference, many):
    """/v1/search over the LanceDB table the image job filled (the gateway's --search-sink, CLIP its
    --search-model): the query embedded by CLIP's text tower, the images ranked by the text-image cosine."""
    import torch

    from embedfleet.services.tokenizer.encoder import TextEncoder
    from embedfleet.shared.model_dir.load import load_model_info
    from embedfleet.shared.protocol import EmbedOptions

    folder, ids, files = many
    if not (fleet.lance / "many_lance.lance").exists():  # run alone: the table the job killed mid-way fills
        sink = f"lancedb://{fleet.lance}?table=many_lance"
        fleet.finished(fleet.reindex(folder, "--sink", sink, "--batch-size", "64", "--job-id", "many_lance"))
    model, _ = reference
    images = clip_file_vectors(reference, files)
    images /= np.linalg.norm(images, axis=1, keepdims=True)
    encoder = TextEncoder(load_model_info(str(fleet.clip)))
    tokens = encoder.encode(encoder.with_prompt(QUERIES, EmbedOptions(input_type="query")))
    for query, row in zip(QUERIES, tokens):
        with torch.inference_mode():
            text = model.get_text_features(input_ids=torch.tensor([row])).pooler_output.numpy()[0]
        scores = images @ (text / np.linalg.norm(text))
        expected = np.argsort(-scores, kind="stable")[:10]
        r = httpx.post(f"{fleet.base}/v1/search", json={"query": query, "top_k": 10}, timeout=60)
        assert r.status_code == 200, r.text
        hits = r.json()["data"]
        found = [ids.index(h["id"]) for h in hits]
        # the reference's order, up to images whose cosines tie within the float noise
        assert np.abs(scores[found] - scores[expected]).max() <= 1e-4, (query, found, expected.tolist())
        assert max(abs(h["score"] - scores[i]) for h, i in zip(hits, found)) <= 1e-3, hits
        assert r.json()["model"] == MODEL


def test_hostile_image_documents(fleet, reference):
    """Refused at submission (400 naming the document, nothing published) where the header shows it:
    bytes that are no image, a PNG header declaring 50,000 x 50,000 pixels; else given up alone by the
    tokenizer, a dead letter naming the document (a truncated file, an animated GIF), the others
    embedded; no process dies."""
    rng = np.random.default_rng(5)
    good = [encoded(noise(30, 30, rng)) for _ in range(3)]
    whole = encoded(noise(40, 40, rng))
    for bad, says in (
        (b"GIF8 but not really an image", "not a PNG, JPEG, WebP or GIF"),
        (huge_png_header(50_000, 50_000), "50000x50000"),
    ):
        documents = [{"id": "ok", "image": data_uri(good[0])}, {"id": "bad", "image": data_uri(bad)}]
        refused = fleet.post({"id": "refused-images", "documents": documents})
        assert refused.status_code == 400, refused.text
        message = refused.json()["error"]["message"]
        assert "'documents[1].image' (document 'bad')" in message and says in message, message
    assert httpx.get(f"{fleet.base}/v1/jobs/refused-images", timeout=10).status_code == 404
    documents = [
        {"id": "g0", "image": data_uri(good[0])},
        {"id": "truncated", "image": data_uri(whole[: len(whole) * 2 // 3])},
        {"id": "g1", "image": data_uri(good[1])},
        {"id": "animated", "image": data_uri(animated_gif(), "image/gif")},
        {"id": "g2", "image": data_uri(good[2])},
    ]
    accepted = fleet.post({"id": "hostile-images", "documents": documents})
    assert accepted.status_code == 202, accepted.text
    state = job_finished(fleet.base, "hostile-images", 60)
    assert (state["status"], state["done"], state["failed"]) == ("done_with_errors", 3, 2), state
    errors = " ".join(state["errors"])
    assert "document 'truncated'" in errors and "document 'animated'" in errors and "animated" in errors, errors
    assert {(d["stage"], d["start"], d["documents"]) for d in state["dead"]} == {
        ("tokenizer", 1, 1),
        ("tokenizer", 3, 1),
    }
    got = fleet.results("hostile-images")
    assert sorted(got) == ["g0", "g1", "g2"]
    _near(np.stack([got[f"g{i}"] for i in range(3)]), clip_file_vectors(reference, good))
    assert all(s.alive for s in fleet.services.values()), fleet.logs()
    Image.open(io.BytesIO(good[0]))  # the files themselves were fine: only the hostile ones failed
