"""``embedfleet up``: a complete local stack, one process per service, on an embedded nats-server."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from embedfleet.services.gateway.config import api_keys, check_sinks, comma_list, operator_keys
from embedfleet.services.gateway.openai.models import model_kind
from embedfleet.services.up.children import Fleet, Restarts, Supervisor
from embedfleet.services.up.lock import hold_data_dir
from embedfleet.services.up.pgvector import TABLE, LocalPgvector, require_pgserver
from embedfleet.services.up.plan import (
    Child,
    children,
    default_model,
    secret_environment,
    served_models,
    with_metrics,
    with_search_store,
)
from embedfleet.services.up.ports import check_ports, port_taken
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import arguments, option
from embedfleet.shared.jobs.settings import retention
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.nats.config import child_environment, nats_security
from embedfleet.shared.nats.local_stack import forget_stack, record_stack
from embedfleet.shared.nats.server import TOKEN_FILE, EmbeddedNats
from embedfleet.shared.observability.logs import setup_logging
from embedfleet.shared.observability.tracing import TracingConfig

log = logging.getLogger("embedfleet.up")

_GATEWAY_DID_NOT_START = 3  # the gateway's exit status when its server did not start (services/gateway/http/uvicorn.py)


def run_stack(ns: argparse.Namespace) -> int:
    setup_logging(ns.log_level, "up", ns.log_format)
    TracingConfig.from_namespace(ns)  # fails now, naming the extra, where --otlp-endpoint needs it
    infos = served_models(ns)  # fail fast on a bad --model
    default = default_model(ns, infos)
    check_sinks(ns.search_sink, comma_list(ns.job_sinks))  # a store's client missing: said before anything starts
    store = LocalPgvector(Path(ns.data_dir)) if ns.with_pgvector else None
    if store is not None:
        require_pgserver()  # missing: said before anything starts
    # one `up` a data folder; its children die with it (they are started from this, the main, thread)
    lock = hold_data_dir(Path(ns.data_dir))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        # taken (another `up`, another server): said before anything starts, naming the holder
        check_ports(ns.host, ns.port, ns.metrics_host, ns.metrics_port)
        if store is not None:  # its guard stops it when this process ends, however it ends
            ns = with_search_store(ns, store.start(), TABLE, infos, default)
        return _run(ns, infos, default, store, stop)
    finally:
        if store is not None:
            store.stop()
            log.info("PostgreSQL stopped")
        lock.close()


def _run(
    ns: argparse.Namespace,
    infos: list[ModelInfo],
    default: ModelInfo,
    store: LocalPgvector | None,
    stop: threading.Event,
) -> int:
    """The stack on ``ns``, until ``stop`` is set or a process dies too often; its exit status."""
    # the URL without credentials (safe to print); credentials and TLS files checked before anything starts
    url, auth, tls = nats_security(ns)
    keys = api_keys(ns) + operator_keys(ns)  # operator keys are accepted keys too: up may check with one
    nats = None
    if url is None:
        # the embedded server asks for a token made for this run: no other user of the machine reaches
        # the fabric; the services get it in their environment, `reindex` and `jobs` from its file
        nats, auth = EmbeddedNats.with_token(Path(ns.data_dir) / "nats", die_with_parent=True)
        url = nats.start()
    ready_dir = Path(tempfile.mkdtemp(prefix="embedfleet-up-"))
    # secrets go to the services in their environment; so do the retention limits, which every
    # service that meets the job streams sets (a flag given to `up` reaches all of them)
    fleet = Fleet({**child_environment(auth, tls, os.environ), **retention(ns).environment(), **secret_environment(ns)})
    try:
        # every service's own ready file; the options shared by every service kind, as the worker takes them
        common = ["--nats", url, *arguments(ns, "worker", ("common", "tracing"), fleet.env, skip=("ready_file",))]
        # the stack's data folder: where a worker keeps its calibrated token budget (calibration/)
        common += ["--data-dir", str(Path(ns.data_dir).resolve())]
        gateway = [*_gateway_args(ns, fleet.env, skip=("default_model",)), "--default-model", default.id]
        # the limits on a job's documents and results the gateway checks, the tokenizers hold to as well
        more = {
            "scorer": arguments(ns, "scorer", ["fleet"], fleet.env),
            "tokenizer": arguments(ns, "tokenizer", ["gateway"], fleet.env),
        }
        plan = children(infos, common, gateway, ready_dir, more)
        host = "127.0.0.1" if ns.host in ("0.0.0.0", "::") else ns.host
        base = f"http://{host}:{ns.port}"
        replicas = _worker_replicas()
        with contextlib.closing(FreePorts(ns.metrics_host)) as ports:  # every service's metrics on a port of its own
            plan = with_metrics(plan, ns.metrics_host, base, replicas, ports)
        # one rule for a death from the first process started to the stop (see stack_fleet)
        supervisor = Supervisor(
            plan, fleet, Restarts(ns.restart_limit, ns.restart_window), nats, store, _why(ns.host, ns.port)
        )
        _init(ns, url, fleet.env)
        if not _start(supervisor, {info.id for info in infos}, base, keys[0] if keys else None, stop, ns.ready_timeout):
            return 1
        print(
            _banner(
                infos,
                default,
                base,
                url,
                plan,
                replicas,
                nats.data_dir / TOKEN_FILE if nats is not None else None,
                _store_lines(store, ns.search_sink, base),
            ),
            flush=True,
        )
        if nats is not None:  # for reindex, jobs and init: where this stack's NATS listens (removed below)
            record_stack(ns.data_dir, url, nats.data_dir / TOKEN_FILE, default.id)
        while not stop.wait(0.5):
            if not supervisor.tend():
                return 1
        return 0
    finally:
        fleet.stop_all()
        if nats is not None:
            forget_stack(ns.data_dir)
            nats.stop()
            log.info("nats-server stopped")
        shutil.rmtree(ready_dir, ignore_errors=True)


def _init(ns: argparse.Namespace, url: str, env: Mapping[str, str]) -> None:
    """``embedfleet init`` with the stack's credential (the embedded server's token is its admin's):
    the services use the streams and bucket it makes or brings to ``up``'s retention, and may not make
    or change them themselves where NATS has per-role users. A refusal is logged: the services then
    use what is there."""
    import subprocess
    import sys

    args = ["--nats", url, *arguments(ns, "init", None, env, skip=("nats",))]
    done = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", "init", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        log.warning("embedfleet init failed (%d): %s", done.returncode, (done.stderr or done.stdout).strip()[-500:])


def _gateway_args(
    ns: argparse.Namespace, environ: Mapping[str, str] | None = None, skip: tuple[str, ...] = ()
) -> list[str]:
    """The gateway's options `up` was given (but those in ``skip``), for a gateway process started with
    ``environ`` (this process's by default): what that environment gives already is not repeated."""
    return arguments(ns, "gateway", ("gateway", "fleet", "metrics", "retention"), environ, skip)


def _start(
    supervisor: Supervisor, models: set[str], base: str, key: str | None, stop: threading.Event, ready_timeout: float
) -> bool:
    """Start the stack and wait until every process is ready and the gateway lists all of ``models``.

    A worker calibrates its batch budget at start-up by timing the device, so the workers start one
    at a time, each once every process started before it is ready: other processes starting beside
    it would skew its timings (and workers calibrating at once would time each other). Each worker
    adds ``ready_timeout`` seconds to the time the whole stack may take. The gateway answers users
    before all this is done: a process that dies meanwhile is seen to as after start-up (started
    again); only one that exits by itself before it was ever ready fails the start.
    """
    plan, fleet = supervisor.plan, supervisor.fleet
    workers = [c for c in plan if c.role == "worker"]
    timeout = ready_timeout * len(workers)
    deadline = time.monotonic() + timeout
    for child in plan:
        if child.role != "worker":
            fleet.start(child)
    while time.monotonic() < deadline and not stop.is_set():
        if not supervisor.tend():
            return False
        ready = [fleet.ready(c) for c in plan]  # every look: remembered, for a death before the next one
        waiting = [w for w in workers if not fleet.started(w)]
        if waiting and all(r for c, r in zip(plan, ready) if fleet.started(c)):
            fleet.start(waiting[0])
        elif all(ready) and models <= set(_listed(base, key)):
            return True
        time.sleep(0.25)
    if not stop.is_set():
        missing = [c.name for c in plan if not c.ready.exists()]
        log.error(
            "the stack did not become ready within %.0fs (not ready: %s)",
            timeout,
            ", ".join(missing) or "none, but the gateway does not list every model",
        )
    return False


def _why(host: str, port: int) -> Callable[[Child, int], str]:
    """The cause of a failed start `up` can tell: the gateway's port taken since `up` checked it."""

    def why(child: Child, code: int) -> str:
        if child.role != "gateway" or code != _GATEWAY_DID_NOT_START:
            return ""
        try:
            taken = port_taken(host, port)
        except ConfigError:
            taken = None
        return f": {taken}" if taken else f" (it did not listen on {host}:{port}; its log above says why)"

    return why


def _listed(base: str, key: str | None) -> list[str]:
    """The model ids the gateway's /v1/models lists (none while it does not answer)."""
    request = urllib.request.Request(f"{base}/v1/models", headers={"authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=2) as resp:
            return [m["id"] for m in json.loads(resp.read())["data"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


class FreePorts:
    """Ports free on ``host``, each held (bound, not listening) until ``close()``, so that no two
    services are given the same one; a service binds its own once started."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._held: list[socket.socket] = []

    def __call__(self, count: int) -> int:
        """The first of ``count`` free ports in a row."""
        for _ in range(100):
            taken = []
            try:
                for i in range(count):
                    s = socket.socket(self._family, socket.SOCK_STREAM)
                    taken.append(s)
                    s.bind((self._host, taken[0].getsockname()[1] + i if i else 0))
            except (OSError, OverflowError):  # taken, or past the last port
                for s in taken:
                    s.close()
                continue
            self._held += taken
            return taken[0].getsockname()[1]
        raise RuntimeError(f"no {count} free ports in a row on {self._host}")

    def close(self) -> None:
        for s in self._held:
            s.close()
        self._held.clear()


def _worker_replicas() -> int:
    """The replicas each worker runs (EMBEDFLEET_REPLICAS reaches the workers in their environment)."""
    try:
        return option("replicas").value(os.environ)
    except ConfigError:
        return 1  # the worker refuses the value itself


def _metrics_lines(plan: Sequence[Child], replicas: int) -> str:
    width = max(len(c.name) for c in plan)
    lines = []
    for c in plan:
        if c.metrics:
            port = urllib.parse.urlsplit(c.metrics).port
            assert port is not None  # with_metrics gives each child a port of its own
            more = (
                f"  (on a CPU, {replicas} replica processes: ports {port}-{port + replicas - 1})"
                if c.role == "worker" and replicas > 1
                else ""
            )
            lines.append(f"    {c.name:<{width}}  {c.metrics}{more}\n")
    return "".join(lines)


def _store_lines(store: LocalPgvector | None, search_sink: str | None, base: str) -> str:
    """The banner's lines on the search route and the local PostgreSQL (its URL, never a given sink's:
    that one may hold a password)."""
    table = f"{store.url}&table={TABLE}" if store is not None else None
    searched = "the table below" if table and search_sink == table else "the --search-sink store"
    lines = f"  POST {base}/v1/search       ({searched})\n" if search_sink else ""
    if store is not None:
        lines += (
            f"  PostgreSQL + pgvector: {table}\n    (data in {store.folder}; reindex --sink URL loads it, and so "
            'does POST /v1/jobs with "sink": URL)\n'
        )
    return lines


def _banner(
    infos: list[ModelInfo],
    default: ModelInfo,
    base: str,
    url: str,
    plan: Sequence[Child] = (),
    replicas: int = 1,
    token_file: Path | None = None,
    store_lines: str = "",
) -> str:
    kinds = {info.id: model_kind(info.task, info.dim, info.outputs) for info in infos}
    width = max(len(kind) for kind in kinds.values())
    served = "\n".join(
        f"  {info.id:<24} {kinds[info.id]:<{width}} {info.path}" + ("  (default)" if info is default else "")
        for info in infos
    )
    try_line = _example(infos, base)
    return (
        f"\nembedfleet is up: {len(infos)} model(s), NATS {url}\n"
        + (
            f"  NATS asks for the token in {token_file} (reindex, jobs: --nats-token-file {token_file})\n"
            if token_file
            else ""
        )
        + f"{served}\n"
        f"  POST {base}/v1/embeddings   (OpenAI API)\n"
        f"  POST {base}/v1/rerank       (cross-encoders; embedders by cosine)\n"
        f"  GET  {base}/v1/models\n"
        f"  GET  {base}/health\n"
        + store_lines
        + (f"  try: {try_line}\n" if try_line else "")
        + ("  metrics (Prometheus), one URL a process:\n" + _metrics_lines(plan, replicas) if plan else "")
        + "Ctrl-C stops everything.\n"
    )


def _example(infos: list[ModelInfo], base: str) -> str | None:
    """A request to try: on the first embedder, else on the first reranker (other kinds: none)."""
    kinds = [(info.id, model_kind(info.task, info.dim, info.outputs)) for info in infos]
    curl = f"curl -s {base}/v1/%s -H 'content-type: application/json' -d '%s'"
    for model, kind in kinds:
        if kind == "embedding":
            return curl % ("embeddings", f'{{"model": "{model}", "input": "hello world"}}')
    for model, kind in kinds:
        if kind == "rerank":
            return curl % ("rerank", f'{{"model": "{model}", "query": "hello", "documents": ["hello world", "bye"]}}')
    return None
