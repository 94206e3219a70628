"""Fixtures shared by the whole suite: the model, the reference implementation, a real NATS server, a
real PostgreSQL with pgvector."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

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
def reference(model_info: ModelInfo, tmp_path_factory):
    """sentence-transformers on the same folder: the reference for vectors (test-only dependency), each
    text encoded once a run (tests/support/reference_vectors.py), whichever process asks first."""
    from sentence_transformers import SentenceTransformer

    from tests.support.reference_vectors import CachedReference

    model = SentenceTransformer(str(model_info.path), device="cpu")
    return CachedReference(model, str(model_info.path), _run_folder(tmp_path_factory) / "reference-vectors.sqlite")


def _run_folder(tmp_path_factory) -> Path:
    """This run's own folder, which every pytest process of the run shares (xdist: the parent of each
    worker's base folder; else the base folder itself, never a folder earlier runs share)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


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


# `up`'s default data folder in the repository: a test that left it behind ran a stack without its own
# --data-dir, and two of those at once meet on its lock (each test gives `up` a folder under tmp_path)
_REPO_DATA = Path(__file__).resolve().parents[1] / ".embedfleet"
_DATA_BEFORE = pytest.StashKey[bool]()


def pytest_sessionstart(session) -> None:
    session.config.stash[_DATA_BEFORE] = _REPO_DATA.exists()


def pytest_sessionfinish(session, exitstatus) -> None:
    if hasattr(session.config, "workerinput") or session.config.stash.get(_DATA_BEFORE, True):
        return
    if _REPO_DATA.exists():
        writer = session.config.get_terminal_writer()
        writer.line()
        writer.line(
            f"FAILED: a test wrote {_REPO_DATA}: every `up` in the tests takes --data-dir under its tmp_path",
            red=True,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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


# Seconds the longest modules took in `make test`'s parallel run (three processes) on two cores: each
# module's tests' setup, call and teardown together, as pytest's JUnit report gives them, rounded. xdist's loadscope sends a module's tests to one worker, largest module
# (most tests) first: these few-but-long modules came last, one worker running them alone while the
# others idled. They go first now, the other integration modules next, the quick unit modules last
# (they fill the gaps). A module missing here only runs later than it should: no test depends on it.
LONG_MODULES = {
    "tests/test_bench.py": 250,
    "tests/integration/test_job_chunks.py": 160,
    "tests/integration/test_up.py": 150,
    "tests/integration/test_job_sinks.py": 120,
    "tests/integration/test_job_faults.py": 115,
    "tests/integration/test_cluster.py": 95,
    "tests/integration/test_hostile_nats.py": 80,
    "tests/integration/test_jobs.py": 70,
    "tests/integration/test_families.py": 55,
    "tests/integration/test_multi_model.py": 50,
    "tests/integration/test_roles.py": 50,
    "tests/integration/test_job_admin.py": 40,
    "tests/integration/test_image_jobs.py": 40,
    "tests/integration/test_images.py": 40,
    "tests/integration/test_up_start.py": 40,
    "tests/integration/test_nats_security.py": 40,
    "tests/integration/test_search.py": 35,
    "tests/integration/test_local_stack.py": 35,
    "tests/integration/test_job_sinks_http.py": 35,
    "tests/integration/test_embeddings.py": 35,
    "tests/integration/test_job_ids.py": 35,
    "tests/integration/test_walkthrough.py": 50,
    "tests/integration/test_permissions.py": 30,
    "tests/integration/test_dashboard.py": 30,
    "tests/integration/test_routing.py": 30,
    "tests/integration/test_rerank.py": 30,
    "tests/shared/nats/test_placement.py": 25,
}
INTEGRATION_SECONDS = 20  # a module of tests/integration/ not listed: processes to start, seconds a test


def scope_seconds(scope: str) -> float:
    """What a module (or class) of tests is expected to take, for the order modules are sent in."""
    module = scope.split("::")[0]
    if module in LONG_MODULES:
        return LONG_MODULES[module]
    return INTEGRATION_SECONDS if module.startswith("tests/integration/") else 0


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope``, its modules sent longest first (``scope_seconds``, then most tests)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class LongestFirst(LoadScopeScheduling):
        def schedule(self) -> None:
            # xdist's own schedule(), but for the order of the work queue
            if self.collection is not None or not self._check_nodes_have_same_collection():
                return super().schedule()
            self.collection = list(next(iter(self.registered_collections.values())))
            if not self.collection:
                return None
            units: dict[str, dict[str, bool]] = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            for scope, nodeids in sorted(units.items(), key=lambda unit: (-scope_seconds(unit[0]), -len(unit[1]))):
                self.workqueue[scope] = nodeids
            for _ in range(len(self.nodes) - len(self.workqueue)):  # more workers than modules
                unused, _assigned = self.assigned_work.popitem()
                unused.shutdown()
            for node in self.nodes:
                self._assign_work_unit(node)
            for node in self.nodes:  # at least two units a node where there are (a unit's last test waits for more)
                self._reschedule(node)
            if not self.workqueue:
                for node in self.nodes:
                    node.shutdown()
            return None

    return LongestFirst(config, log)
