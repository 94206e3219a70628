"""Fixtures shared by the whole suite: the model, the reference implementation, a real NATS server, a
real PostgreSQL with pgvector."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.nats.server import EmbeddedNats

# outputs equal the reference when every cosine is at least this (float32 on CPU)
COSINE_TOLERANCE = 0.9999


@pytest.fixture(scope="session")
def model_info() -> ModelInfo:
    return load_model_info(None)


@pytest.fixture
def hub_offline(monkeypatch) -> None:
    """huggingface_hub's offline mode for one test: no hub on the network, local folders only (the
    variable HF_HUB_OFFLINE is read once, at import; the HF clients' tests talk to our gateway)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="session")
def reference(model_info: ModelInfo):
    """sentence-transformers on the same folder: the reference for vectors (test-only dependency)."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_info.path), device="cpu")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def unit_rows(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """[n, dim] float32 random rows of norm 1 (vectors as a normalising model makes them)."""
    v = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _docker_engine_reason() -> str | None:
    """None when a Docker engine answers, else why not."""
    try:
        import docker

        docker.from_env(timeout=3).ping()
        return None
    except Exception as exc:
        return f"no Docker engine ({type(exc).__name__}: {str(exc)[:100]})"


_DOCKER_REASON = _docker_engine_reason()


def pytest_report_header(config) -> str:
    if _DOCKER_REASON is None:
        return "NATS for tests: testcontainers' NATS container (Docker engine found)"
    return f"NATS for tests: nats-server binary on a free port; container path skipped: {_DOCKER_REASON}"


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory) -> Iterator[str]:
    """A real NATS server: testcontainers' NATS container when Docker runs, else the nats-server binary."""
    if _DOCKER_REASON is None:
        from testcontainers.community.nats import NatsContainer

        with NatsContainer("nats:2.10", jetstream=True) as container:
            yield container.nats_uri()
    else:
        server = EmbeddedNats(tmp_path_factory.mktemp("nats"))
        with server:
            yield server.url


@pytest.fixture
def nats_container_url() -> Iterator[str]:
    """Only the container path (skipped, with the reason, where no Docker engine runs)."""
    if _DOCKER_REASON is not None:
        pytest.skip(f"NATS container path: {_DOCKER_REASON}")
    from testcontainers.community.nats import NatsContainer

    with NatsContainer("nats:2.10", jetstream=True) as container:
        yield container.nats_uri()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A real PostgreSQL with pgvector (pgserver ships both), one a test process (a module's tables go
    in a database of its own: ``postgres_uri``). Yields the ``pgserver.PostgresServer``."""
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    try:
        yield server
    finally:
        stop_postgres(server)
        server.cleanup()


def stop_postgres(server) -> None:
    """Stop a pgserver server on its data folder, as an operator would (fast: open connections closed)."""
    import subprocess

    from pgserver._commands import pg_ctl

    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)
    except subprocess.CalledProcessError:
        pass  # stopped already


@pytest.fixture(scope="module")
def postgres_uri(postgres, request) -> str:
    """The URL of a database of ``postgres`` made for the module (named after it), so that modules
    sharing the server never meet in a table; add ``&table=NAME`` for a sink."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    name = request.module.__name__.rpartition(".")[2].lower()
    uri = postgres.get_uri()
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return urlunsplit(urlsplit(uri)._replace(path=f"/{name}"))
