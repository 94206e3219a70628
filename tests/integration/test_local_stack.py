"""Commands beside a running `embedfleet up` find it through the record it keeps (stack.json): its NATS,
its token and its default model, looked for in $EMBEDFLEET_DATA_DIR, then ./.embedfleet (or in --data-dir alone).

The stack here serves two models, as the multi-model example of docs/models.md does: ``mini`` (all-MiniLM-L6-v2,
the first --model: the default) and ``rr`` (a tiny cross-encoder), so no command can take "the only
model" for the default.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from embedfleet.shared.model_dir.folder import default_model_path
from embedfleet.shared.nats.local_stack import LocalStack, read_stack
from embedfleet.shared.nats.server import free_port
from tests.support.procs import Service, one_shot, port_open, wait_until
from tests.support.tiny_models import build

pytestmark = pytest.mark.integration

NATS_ENV = ("EMBEDFLEET_NATS", "NATS_URL", "EMBEDFLEET_DATA")  # a URL, a credential or a data folder given


@dataclass
class LocalUp:
    root: Path  # the folder whose ./.embedfleet is the stack's data folder
    data: Path
    stack: LocalStack
    base_url: str
    up: Service


def _clear_nats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(NATS_ENV):
            monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def local_up(tmp_path_factory) -> Iterator[LocalUp]:
    root = tmp_path_factory.mktemp("local-stack")
    data = root / ".embedfleet"  # the default folder's name: found from ``root`` with no flag and no variable
    reranker = build("bert", root / "models", classifier=True, num_labels=1)
    port = free_port()
    args = ["--data-dir", str(data), "--port", str(port), "--model", f"mini={default_model_path()}"]
    with pytest.MonkeyPatch.context() as mp:
        _clear_nats_environment(mp)
        # a fixed engine budget (test_up runs the start-up calibration); one torch thread a worker
        up = Service(
            "up",
            [*args, "--model", f"rr={reranker}"],
            root,
            {"EMBEDFLEET_MAX_BATCH_TOKENS": "1024", "OMP_NUM_THREADS": "1"},
        )
    try:
        wait_until(lambda: "embedfleet is up" in up.log(), 300, "the stack", [up])
        stack = read_stack(data)
        assert stack is not None, up.log()[-3000:]
        yield LocalUp(root, data, stack, f"http://127.0.0.1:{port}", up)
    finally:
        assert up.stop(60) == 0, up.log()[-3000:]


def _documents(folder: Path, count: int = 12) -> Path:
    docs = folder / "docs.jsonl"
    docs.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document number {i}"}) + "\n" for i in range(count)))
    return docs


def test_up_records_its_default_model(local_up):
    assert json.loads((local_up.data / "stack.json").read_text())["default_model"] == "mini"
    assert local_up.stack.default_model == "mini"


def test_reindex_given_no_model_uses_the_stacks_default(local_up, tmp_path):
    """The README's `reindex docs.jsonl --out vectors.npy` against `up --model mini=… --model rr=…`: the model
    the stack's gateway uses for requests naming none, not a fixed id the stack may not serve."""
    docs, out = _documents(tmp_path), tmp_path / "d.npy"
    result, _ = one_shot(["reindex", str(docs), "--out", str(out), "--quiet", "--data-dir", str(local_up.data)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "model mini" in result.stdout and np.load(out).shape == (12, 384)


def test_reindex_given_a_url_and_no_model_refuses_to_guess_among_several(local_up, tmp_path):
    """With --nats no record says which model is the default: the fleet's only model would be, and of
    two it names both and asks for one."""
    docs = _documents(tmp_path)
    given = ["--nats", local_up.stack.url, "--nats-token-file", str(local_up.stack.token_file)]
    result, _ = one_shot(["reindex", str(docs), "--out", str(tmp_path / "d.npy"), *given])
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == (
        "embedfleet: error: several models are served (mini, rr) and no `embedfleet up` recorded which is the "
        "default: name one with --model; nothing was published\n"
    )


def test_fleet_client_given_no_model_embeds_with_the_stacks_default(local_up, monkeypatch):
    """FleetClient, finding the stack, embeds with the default model: the vector TEI's /embed (a route
    that takes no model) answers for the same text."""
    from embedfleet.shared.nats.fleet_client import FleetClient

    _clear_nats_environment(monkeypatch)

    async def embed() -> np.ndarray:
        async with await FleetClient.connect(data_dir=str(local_up.data)) as fleet:
            return await fleet.embed(["how do I reset my password?"])

    vectors = asyncio.run(embed())
    r = httpx.post(f"{local_up.base_url}/embed", json={"inputs": "how do I reset my password?"}, timeout=60)
    assert r.status_code == 200, r.text
    assert vectors.shape == (1, 384) and np.allclose(vectors, np.array(r.json(), np.float32), atol=1e-5)


def test_a_scorer_started_beside_the_stack_joins_it(local_up, tmp_path, monkeypatch):
    """docs/reranking.md's `embedfleet scorer --model DIR` next to a running `up`: it connects to the stack's NATS
    with its token, as recorded, instead of retrying nats://127.0.0.1:4222."""
    _clear_nats_environment(monkeypatch)
    ready = tmp_path / "scorer.ready"
    args = ["--model", str(default_model_path()), "--model-name", "mini", "--ready-file", str(ready)]
    scorer = Service("scorer", [*args, "--data-dir", str(local_up.data)], tmp_path)
    try:
        wait_until(ready.exists, 120, "the scorer ready", [scorer])
        assert f"scorer ready (nats {local_up.stack.url}, a token)" in scorer.log(), scorer.log()[-2000:]
    finally:
        assert scorer.stop() == 0, scorer.log()[-2000:]


def test_the_stack_is_found_from_the_flag_the_variable_or_the_default_folder(local_up, tmp_path):
    """$EMBEDFLEET_DATA_DIR, then ./.embedfleet, or the --data-dir given alone; with none recording a
    running `up`, the error names each record looked for."""
    nowhere, elsewhere = tmp_path / "nowhere", tmp_path / "elsewhere"
    # the variable names a folder without a record: ./.embedfleet (the stack's) is looked at next
    found, _ = one_shot(["jobs"], {"EMBEDFLEET_DATA_DIR": str(elsewhere)}, cwd=local_up.root)
    assert found.returncode == 0 and found.stdout.startswith("job "), found.stdout + found.stderr
    # the variable names the stack's folder, from anywhere
    found, _ = one_shot(["jobs"], {"EMBEDFLEET_DATA_DIR": str(local_up.data)}, cwd=tmp_path)
    assert found.returncode == 0 and found.stdout.startswith("job "), found.stdout + found.stderr
    if port_open(4222):
        return  # a NATS on the default port would answer the default URL

    def refused(args: list[str], environ: dict[str, str], records: str) -> None:
        lost, took = one_shot(args, environ, cwd=tmp_path)
        assert lost.returncode == 2 and took < 20
        assert lost.stderr.splitlines()[-1] == (  # after the refusals logged
            f"embedfleet: error: no NATS server at nats://127.0.0.1:4222 (the default; no running `embedfleet up` "
            f"recorded in {records}): start `embedfleet up`, or give --nats URL"
        )

    refused(
        ["jobs"],
        {"EMBEDFLEET_DATA_DIR": str(elsewhere)},
        f"{elsewhere / 'stack.json'} or {tmp_path / '.embedfleet' / 'stack.json'}",
    )
    # a folder named by the flag is the one meant: the variable's stack is not taken in its place
    refused(
        ["jobs", "--data-dir", str(nowhere)], {"EMBEDFLEET_DATA_DIR": str(local_up.data)}, str(nowhere / "stack.json")
    )
