"""docs/search.md's walk-through "From documents to search", run as typed on a real stack: `make run
ARGS=...` as the Makefile runs it (`.venv/bin/embedfleet up ARGS`, in a fresh working folder whose
`.venv` is this Python's), with the real all-MiniLM-L6-v2 and a real PostgreSQL with pgvector from
pgserver; then every line of the second terminal's block through bash, as written (only the page's
port 8080 becomes the test's free port); the answer checked against the files made and the answer the
page shows; then Ctrl-C as a terminal sends it (SIGINT to the whole process group), after which no
postgres of the data folder is left. A postgres that dies is started again, and `up` killed outright
takes its PostgreSQL along."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from embedfleet.shared.nats.server import free_port
from tests.support.procs import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCORE_TOLERANCE = 0.01  # the page's two-digit scores against the answer's
# the environment of a newcomer's terminal: no NATS or data folder chosen (the stack is found by its record);
# the worker's token budget given (as in test_up): only test_up_with_embedded_nats calibrates
_CHOSEN = ("EMBEDFLEET_NATS", "NATS_URL", "EMBEDFLEET_DATA_DIR", "EMBEDFLEET_PORT", "EMBEDFLEET_SEARCH")


def _section(title: str = "From documents to search") -> str:
    page = (ROOT / "docs" / "search.md").read_text()
    return page.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", section, re.M | re.S)


def _terminal(port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CHOSEN)}
    return {**env, "EMBEDFLEET_PORT": str(port), "EMBEDFLEET_MAX_BATCH_TOKENS": "2048"}


@pytest.fixture
def work() -> Iterator[Path]:
    """A fresh folder with this Python's venv as its .venv (where `make run` installs). In /tmp itself,
    not under pytest's folder: a pytest session starting meanwhile makes that folder its owner's alone
    again, and then the user pgserver runs PostgreSQL as (when the tests run as root) could not reach
    its data; and its path short enough for PostgreSQL's socket inside .embedfleet/pgvector."""
    assert (Path(sys.prefix) / "bin" / "embedfleet").is_file(), "the embedfleet command is not installed in this venv"
    folder = Path(tempfile.mkdtemp(prefix="embedfleet-walk-"))
    (folder / ".venv").symlink_to(sys.prefix)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _up(work: Path, args: list[str], port: int) -> tuple[subprocess.Popen, Path]:
    """`make run ARGS=...` as the Makefile's recipe runs it, in a process group of its own (a terminal's)."""
    recipe = re.search(r"^run:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert recipe == "$(BIN)/embedfleet up $(ARGS)", recipe
    log = work / "up.log"
    proc = subprocess.Popen(
        [".venv/bin/embedfleet", "up", *args],
        cwd=work,
        env=_terminal(port),
        stdout=open(log, "wb"),  # noqa: SIM115 (the child holds it)
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_until(lambda: "embedfleet is up" in log.read_text() or proc.poll() is not None, 120, "the stack")
    assert proc.poll() is None, log.read_text()[-4000:]
    return proc, log


def _postgres_of(folder: Path) -> list[psutil.Process]:
    """The live postgres processes (postmaster and backends) of the data folder ``folder``."""
    return [
        p
        for p in psutil.process_iter(["cmdline", "status"])
        if p.info["status"] != psutil.STATUS_ZOMBIE and str(folder) in " ".join(p.info["cmdline"] or ())
    ]


def _gone(folder: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _postgres_of(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _postgres_of(folder)


def _end(proc: subprocess.Popen, folder: Path) -> None:
    """What a failed test leaves: the stack and its PostgreSQL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for p in _postgres_of(folder):
        p.kill()


def _make_run_args(start: str) -> list[str]:
    """The ARGS of the page's one `make run ARGS=...` line, as make hands them to the recipe."""
    (make_run,) = start.strip().splitlines()
    return shlex.split(re.fullmatch(r"make run (ARGS=.*)", make_run).group(1))[0].removeprefix("ARGS=").split()


def _typed(work: Path, block: str, port: int) -> list[str]:
    """Each line of a second terminal's block through bash, as written (the page's port made the test's)."""
    outputs = []
    for line in (line for line in block.splitlines() if line.strip()):
        done = subprocess.run(
            ["bash", "-c", line.replace("localhost:8080", f"localhost:{port}")],
            cwd=work,
            env=_terminal(port),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, (line, done.stdout, done.stderr[-3000:])
        outputs.append(done.stdout)
    return outputs


def _stack_with_pgvector(work: Path, args: list[str], port: int) -> tuple[subprocess.Popen, Path, Path, str]:
    """`up` with --with-pgvector as the page starts it: (the process, its log, the PostgreSQL data folder,
    the table URL the banner prints)."""
    assert "--with-pgvector" in args
    pgdata = work / ".embedfleet" / "pgvector"
    proc, log = _up(work, args, port)
    banner = log.read_text()
    table = f"postgresql://postgres@/postgres?host={pgdata}&table=documents"
    assert f"PostgreSQL + pgvector: {table}\n" in banner and f"POST http://127.0.0.1:{port}/v1/search" in banner
    assert _postgres_of(pgdata), "no postgres runs on the data folder"
    return proc, log, pgdata, table


def _ctrl_c(proc: subprocess.Popen, log: Path, pgdata: Path) -> None:
    """Ctrl-C in the first terminal: SIGINT to the whole group, as a terminal sends it; the data kept."""
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(60) == 0, log.read_text()[-3000:]
    assert _gone(pgdata, 5), [p.info for p in _postgres_of(pgdata)]
    assert not (pgdata / ".s.PGSQL.5432").exists() and (pgdata / "PG_VERSION").is_file()
    assert "PostgreSQL stopped" in log.read_text()


def test_the_walk_through_runs_as_typed(work):
    section = _section()
    start, second = _blocks(section, "sh")
    (shown,) = _blocks(section, "json")
    port = free_port()
    proc, log, pgdata, table = _stack_with_pgvector(work, _make_run_args(start), port)
    try:
        outputs = _typed(work, second, port)
        assert "reindex notes --sink" in second and f"-> {table} (4 rows)" in outputs[-2], outputs[-2]
        answer = json.loads(outputs[-1])
        print(json.dumps(answer))
        files = {
            p.relative_to(work / "notes").as_posix(): p.read_text() for p in (work / "notes").rglob("*") if p.is_file()
        }
        assert len(files) == 4 and "travel/flights.md" in files
        query = json.loads(re.search(r"-d '(\{.*\})'", second.splitlines()[-1]).group(1))
        hits = answer["data"]
        assert len(hits) == query["top_k"] and answer["model"] == "all-MiniLM-L6-v2"
        for hit in hits:  # the files' paths in the folder, their texts as written, no metadata
            assert hit["text"] == files[hit["id"]] and hit["metadata"] == {}, hit
        assert hits[0]["id"] == "passwords.txt" and "password" in query["query"]  # the query was written for it
        # the answer the page shows: the same rows, in the same order, the same scores to two digits
        assert re.findall(r'"id": "([^"]+)"', shown) == [h["id"] for h in hits], hits
        for score, hit in zip(re.findall(r'"score": ([0-9.-]+)', shown), hits):
            assert abs(float(score) - hit["score"]) < SCORE_TOLERANCE, (score, hit)
        assert f'"prompt_tokens": {answer["usage"]["prompt_tokens"]}' in shown
        _ctrl_c(proc, log, pgdata)
    finally:
        _end(proc, pgdata)


def test_the_image_walk_through_runs_as_typed(work):
    """docs/search.md's "From images to search", as typed: a CLIP folder (a tiny one, built where the page
    says the newcomer's is: ./clip) served with pgvector, a folder of pictures drawn and reindexed, a text
    query answered with the pictures ranked as transformers' CLIPModel ranks them."""
    import torch
    from PIL import Image
    from transformers import CLIPImageProcessor, CLIPModel

    from embedfleet.services.tokenizer.encoder import TextEncoder
    from embedfleet.shared.model_dir.load import load_model_info
    from embedfleet.shared.protocol import EmbedOptions
    from tests.support.image_models import build_clip

    section = _section("From images to search")
    start, second = _blocks(section, "sh")
    args = _make_run_args(start)
    assert args[args.index("--model") + 1] == "./clip"
    folder = build_clip(work, shortest_edge=40)  # ./clip
    port = free_port()
    proc, log, pgdata, table = _stack_with_pgvector(work, args, port)
    try:
        outputs = _typed(work, second, port)
        assert "reindex photos --sink" in second and f"-> {table} (3 rows)" in outputs[-2], outputs[-2]
        answer = json.loads(outputs[-1])
        query = json.loads(re.search(r"-d '(\{.*\})'", second.splitlines()[-1]).group(1))
        hits = answer["data"]
        files = sorted(p.relative_to(work / "photos").as_posix() for p in (work / "photos").rglob("*") if p.is_file())
        assert files == ["green.webp", "plain/navy.jpg", "red.png"] and answer["model"] == "clip"
        assert sorted(h["id"] for h in hits) == files and all(h.get("text") is None for h in hits), hits
        # the reference: the query through transformers' text tower (tokenized as the fleet does), each picture
        # through its image processor and image tower; the answer in the order of their cosines
        model, processor = (
            CLIPModel.from_pretrained(str(folder)).eval(),
            CLIPImageProcessor.from_pretrained(str(folder)),
        )
        encoder = TextEncoder(load_model_info(str(folder)))
        ids = encoder.encode(encoder.with_prompt([query["query"]], EmbedOptions(input_type="query")))
        with torch.inference_mode():
            text = model.get_text_features(input_ids=torch.tensor(ids)).pooler_output[0]
            pixels = processor(images=[Image.open(work / "photos" / f) for f in files], return_tensors="pt")
            pictures = model.get_image_features(pixel_values=pixels["pixel_values"]).pooler_output
        cosines = torch.nn.functional.cosine_similarity(pictures, text[None], dim=1).tolist()
        expected = sorted(zip(files, cosines), key=lambda fc: -fc[1])
        assert [h["id"] for h in hits] == [f for f, _ in expected], (hits, expected)
        for hit, (_, cosine) in zip(hits, expected):
            assert abs(hit["score"] - cosine) < 1e-3, (hit, cosine)
        _ctrl_c(proc, log, pgdata)
    finally:
        _end(proc, pgdata)


def _postmaster(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])


def test_up_starts_a_dead_postgres_again_and_killed_outright_takes_it_along(work):
    port = free_port()
    pgdata = work / ".embedfleet" / "pgvector"
    proc, log = _up(work, ["--with-pgvector"], port)
    try:
        first = _postmaster(pgdata)
        assert psutil.Process(first).ppid() != proc.pid  # pg_ctl's daemon: not a child, its guard stops it
        os.kill(first, signal.SIGKILL)
        wait_until(
            lambda: (
                "PostgreSQL (pgvector) exited; starting it again" in log.read_text()
                and (pgdata / "postmaster.pid").exists()
                and _postmaster(pgdata) != first
                and psutil.pid_exists(_postmaster(pgdata))
            ),
            30,
            "postgres started again",
        )
        assert proc.poll() is None, log.read_text()[-3000:]
        assert log.read_text().count("PostgreSQL (pgvector) exited") == 1  # started again at the first try
        proc.kill()
        proc.wait()
        started = time.monotonic()
        assert _gone(pgdata, 30), ([p.info for p in _postgres_of(pgdata)], log.read_text()[-3000:])
        print(f"postgres ended {time.monotonic() - started:.1f}s after `up` was killed")
    finally:
        _end(proc, pgdata)
