"""A vector store named where its client is not installed (no extra 'sinks'): every command given its
URL (gateway --search-sink / --job-sinks, up, reindex --sink) refuses at start, before it serves or
publishes anything, in one line naming the extra, exit 2. Each runs as a real process in which the
client's modules are not importable (tests/support/role_site/sitecustomize.py refuses them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from embedfleet.shared.nats.server import free_port
from tests.support.role_images import absent_env

pytestmark = pytest.mark.integration

INSTALL = "which the extra 'sinks' installs: pip install 'embedfleet[sinks]'"
PG = "postgresql://loader:secret@127.0.0.1:5432/docs?table=chunks"
PG_SHOWN = "postgresql://loader:***@127.0.0.1:5432/docs?table=chunks"


def _refusal(args: list[str], absent: tuple[str, ...]) -> str:
    """The one line a command that must refuse writes, once it exited 2 (a command that serves instead
    outlives the timeout: the test fails)."""
    done = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**absent_env(absent), "EMBEDFLEET_LOG_LEVEL": "warning"},
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert done.stdout == "", done.stdout
    return done.stderr


@pytest.mark.parametrize(
    "flags, absent, line",
    [
        (
            ["--search-sink", PG, "--search-model", "all-MiniLM-L6-v2"],
            ("psycopg",),
            f"--search-sink {PG_SHOWN} needs psycopg, {INSTALL}",
        ),
        (
            ["--job-sinks", "qdrant://127.0.0.1:6333"],
            ("qdrant_client",),
            f"--job-sinks qdrant://127.0.0.1:6333?collection=embeddings needs qdrant_client, {INSTALL}",
        ),
        (
            ["--search-sink", "lancedb:///srv/lance?table=docs"],
            ("lancedb",),
            f"--search-sink lancedb:///srv/lance?table=docs needs lancedb, {INSTALL}",
        ),
    ],
    ids=["pgvector", "qdrant", "lancedb"],
)
def test_a_gateway_refuses_a_store_whose_client_is_missing(nats_url, flags, absent, line):
    stderr = _refusal(["gateway", "--nats", nats_url, "--port", str(free_port()), *flags], absent)
    assert stderr == f"embedfleet: error: {line}\n"


def test_up_refuses_a_store_whose_client_is_missing_before_starting_anything(tmp_path):
    data = tmp_path / "data"
    stderr = _refusal(["up", "--data-dir", str(data), "--port", str(free_port()), "--search-sink", PG], ("psycopg",))
    assert stderr.splitlines()[-1] == f"embedfleet: error: --search-sink {PG_SHOWN} needs psycopg, {INSTALL}"
    assert not (data / "nats").exists()  # no nats-server was started


def test_reindex_refuses_a_store_whose_client_is_missing_before_publishing(nats_url, tmp_path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "text": "hello"}\n')
    stderr = _refusal(["reindex", str(docs), "--nats", nats_url, "--sink", PG], ("pgvector",))
    assert stderr == f"embedfleet: error: --sink {PG_SHOWN} needs pgvector, {INSTALL}\n"
