"""The ``embedfleet`` command: ``up`` starts the whole local stack; one sub-command per service."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from embedfleet.services.gateway import config as gateway_config
from embedfleet.services.gpu_worker import config as worker_config
from embedfleet.services.scorer import config as scorer_config
from embedfleet.services.tokenizer import config as tokenizer_config
from embedfleet.shared import __version__
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import add_options
from embedfleet.shared.extras import missing_extra
from embedfleet.shared.jobs.settings import retention
from embedfleet.shared.nats.config import NatsConfig, nats_config
from embedfleet.shared.nats.lifecycle import ONE_SHOT_PATIENCE, NatsUnreachable, run_async, run_service, wait_for_nats
from embedfleet.shared.nats.local_stack import NatsSource, use_local_stack
from embedfleet.shared.observability.logs import setup_logging

log = logging.getLogger("embedfleet")

HELP = {
    "up": "start the whole local stack, one model or several (embedded nats-server unless --nats is given)",
    "gateway": "run the HTTP gateway",
    "reindex": "embed a file of documents as a bulk job (JetStream), resumable",
    "jobs": "list bulk jobs with their progress, rate and ETA, or act on one",
    "check": "tell whether model folders will serve, and how (family, pooling, dims, backends)",
    "auth": "write a nats-server authorization (an nkey user per role, each allowed only its own subjects) and each "
    "role's seed file, then exit",
    "init": "create the JetStream streams and the job bucket (idempotent), then exit",
    "tokenizer": "run a tokenizer",
    "worker": "run a worker (the engine; CUDA when present, else CPU)",
    "scorer": "run a scorer (reranking)",
}


def build_parser() -> argparse.ArgumentParser:
    """Every command's parser, its options those ``embedfleet.shared.config.registry`` declares for it."""
    parser = argparse.ArgumentParser(prog="embedfleet", description="Embedding and reranking serving over NATS.")
    parser.add_argument("--version", action="version", version=f"embedfleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = {name: sub.add_parser(name, help=text) for name, text in HELP.items()}
    commands["reindex"].add_argument(
        "input",
        help='documents: .jsonl ({"id", "text"}), .parquet (id, text), text (one a line), or a folder '
        "(its .txt and .md files, one a file, the path in the folder for an id)",
    )
    commands["check"].add_argument("folders", nargs="+", metavar="MODEL_DIR", help="local Hugging Face model folders")
    commands["auth"].add_argument(
        "folder", help="where to write auth.conf (for the server) and <role>.nk (one per role)"
    )
    for name, command in commands.items():
        add_options(command, name)
    actions = commands["jobs"].add_subparsers(dest="jobs_command", metavar="ACTION")
    for name, text in (
        ("purge", "remove a job's results, dead letters and record"),
        ("cancel", ("stop a job: nothing more of it is published or computed; what was stored stays until purged")),
        ("fetch", "write a finished job's vectors to a file, as reindex --out writes them"),
    ):
        action = actions.add_parser(name, help=text)
        # the options of jobs again, after the action: one not given there keeps the value given
        # before the action (or its default) instead of resetting it
        add_options(action, "jobs", suppress=True)
        action.add_argument("job", help="the job id")
        add_options(action, f"jobs {name}")
    return parser


def main(argv: list[str] | None = None) -> None:
    command = "embedfleet"
    try:
        ns = build_parser().parse_args(argv)
        command = f"embedfleet {ns.command}"
        _dispatch(ns)
    except ConfigError as exc:
        print(f"embedfleet: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except ModuleNotFoundError as exc:  # a role started where its extra is not installed (its own image's)
        if (missing := missing_extra(exc, command)) is None:
            raise
        print(f"embedfleet: error: {missing}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


def _dispatch(ns: argparse.Namespace) -> None:
    command = ns.command
    if command == "check":
        from embedfleet.services.cli.check import main as check

        sys.exit(check(ns.folders, ns.json))
    if command == "auth":
        sys.exit(_write_auth(ns))
    if command == "up":
        from embedfleet.services.up.launch import run_stack

        sys.exit(run_stack(ns))
    setup_logging(ns.log_level, command, ns.log_format)
    # no NATS URL or credential given: the stack `up` recorded (--data-dir, $EMBEDFLEET_DATA_DIR, .embedfleet)
    source = use_local_stack(ns)
    if command in ("reindex", "jobs", "init"):
        sys.exit(_run_admin(ns, source))
    if command == "gateway":
        from embedfleet.services.gateway.app import serve

        gateway_cfg = gateway_config.GatewayConfig.from_namespace(ns)
        if _nats_answers(gateway_cfg.nats, source, "gateway"):
            serve(gateway_cfg, ns.log_level)
    elif command == "tokenizer":
        from embedfleet.services.tokenizer.service import TokenizerService

        cfg = tokenizer_config.TokenizerConfig.from_namespace(ns)
        cfg.apply_threads()
        if _nats_answers(cfg.nats, source, "tokenizer"):
            run_service("tokenizer", cfg.nats, lambda nc: TokenizerService(nc, cfg))
    elif command == "worker":
        _run_worker(ns, source)
    elif command == "scorer":
        from embedfleet.services.scorer.service import ScorerService

        scorer_cfg = scorer_config.ScorerConfig.from_namespace(ns)
        if _nats_answers(scorer_cfg.nats, source, "scorer"):
            run_service("scorer", scorer_cfg.nats, lambda nc: ScorerService(nc, scorer_cfg))


def _nats_answers(nats: NatsConfig, source: NatsSource, role: str) -> bool:
    """Whether the service may start. With no URL, no credential and no stack recorded, NATS must answer
    at the default URL within a few seconds (else a ConfigError: where a stack was looked for, what to
    do). The gateway waits for its NATS here, as long as it takes, because uvicorn's start-up, where
    it connects, does not stop on a signal. False: SIGTERM or SIGINT came first (it stopped)."""
    if not source.fallback and role != "gateway":
        return True  # run_service connects, retrying until NATS answers or a signal stops it
    try:
        answered = wait_for_nats(nats, role, ONE_SHOT_PATIENCE if source.fallback else None)
    except NatsUnreachable as exc:
        raise source.unreachable(str(exc)) from None
    if not answered:
        log.info("%s stopped before NATS accepted it", role)
    return answered


def _run_admin(ns: argparse.Namespace, source: NatsSource) -> int:
    """reindex, init, and jobs with its actions: each one coroutine against NATS; its exit status."""
    from embedfleet.services.jobs.admin import list_jobs, purge_job
    from embedfleet.services.jobs.cancel import cancel
    from embedfleet.services.jobs.fetch import fetch
    from embedfleet.services.jobs.plan import model_of, plan_of
    from embedfleet.services.jobs.reindex import reindex
    from embedfleet.services.jobs.streams_init import init_jetstream
    from embedfleet.shared.jobs.publish import JobConflict

    cfg = nats_config(ns)

    async def run_reindex() -> int:
        plan = plan_of(ns)  # every check that needs no NATS (the sink's client, the input) before the fleet is asked
        return await reindex(plan.for_model(await model_of(ns.model, source.stack, cfg)), cfg)

    run = {
        "reindex": run_reindex,
        "jobs": lambda: list_jobs(cfg),
        "jobs purge": lambda: purge_job(cfg, ns.job, ns.force),
        "jobs cancel": lambda: cancel(cfg, ns.job),
        "jobs fetch": lambda: fetch(cfg, ns.job, Path(ns.out)),
        "init": lambda: init_jetstream(cfg, retention(ns)),
    }
    action = getattr(ns, "jobs_command", None)
    try:
        return run_async(run[f"{ns.command} {action}" if action else ns.command]())
    except NatsUnreachable as exc:
        raise source.unreachable(str(exc)) from None
    except JobConflict as exc:  # a job id naming another job (made another way, another form, cancelled)
        raise ConfigError(str(exc)) from None


def _run_worker(ns: argparse.Namespace, source: NatsSource) -> None:
    # GNU OpenMP's threads spin 300,000 times after each parallel region before they sleep: a few
    # ms here, so an engine thread between two queries holds a core that the gateway, tokenizer
    # and NATS need on a shared machine, and is preempted by them in the next batch, which then
    # waits at every barrier. 3,000 spins still cover the gaps between one forward's ops. Read
    # when torch loads OpenMP, so set before that; an explicit GOMP_SPINCOUNT wins.
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")
    from embedfleet.services.gpu_worker.replicas import build_engines, is_cpu, replica_threads, run_cpu_processes
    from embedfleet.services.gpu_worker.service import WorkerService

    cfg = worker_config.WorkerConfig.from_namespace(ns)
    if not _nats_answers(cfg.nats, source, "worker"):  # before the model is loaded
        return
    # oneDNN keeps one primitive per GEMM shape (1024 by default), so batches of every token count
    # make a worker's memory climb under steady traffic. The engine pads CPU batches to a multiple
    # of 8 tokens, and 256 primitives hold every shape a query or a batch needs: memory stays
    # bounded and a query rarely pays a primitive's creation (~1 ms at 64 primitives).
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256")
    if cfg.replicas > 1 and is_cpu(cfg):
        sys.exit(run_cpu_processes(cfg, ns))
    threads = replica_threads(cfg.replicas)
    # load weights (and calibrate) before taking work, on the thread that will run the engine
    engines = threads[0].submit(build_engines, cfg).result()
    run_service("worker", cfg.nats, lambda nc: WorkerService(nc, cfg, engines, threads))


def _write_auth(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from embedfleet.shared.nats.subjects import Subjects
    from embedfleet.shared.permissions import ROLES, write_auth

    folder = Path(ns.folder)
    existing = [r for r in ROLES if (folder / f"{r}.nk").exists()]
    if existing and not ns.force:
        raise ConfigError(
            f"{folder} already holds seeds ({', '.join(existing)}.nk): give --force to replace them "
            "(every process using them must then get the new ones)"
        )
    try:
        conf = write_auth(folder, Subjects(ns.subject_prefix))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    print(f"wrote {conf} (include it in the nats-server config) and a seed per role:")
    for role in ROLES:
        print(f"  {role:10} {folder / f'{role}.nk'}  (--nats-nkey-seed)")
    return 0


if __name__ == "__main__":
    main()
