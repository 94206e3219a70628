"""The ``embedfleet`` command: ``up`` starts the whole local stack; one sub-command per service."""

from __future__ import annotations

import argparse
import os
import sys

from shared import __version__
from shared.config import (
    ConfigError,
    add_common_arguments,
    add_model_arguments,
    add_option,
    add_retention_arguments,
    nats_config,
    positive_float,
    positive_int,
    retention,
)
from shared import tracing
from shared.lifecycle import run_async, run_service
from shared.logs import setup_logging
from shared.quantize import EMBEDDING_TYPES
from services import stack_plan
from services.gateway import config as gateway_config
from services.gpu_worker import config as worker_config
from services.scorer import config as scorer_config
from services.tokenizer import config as tokenizer_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="embedfleet", description="Embedding and reranking serving over NATS.")
    parser.add_argument("--version", action="version", version=f"embedfleet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start the whole local stack, one model or several (embedded nats-server unless --nats is given)")
    add_common_arguments(up, nats_required=False)
    stack_plan.add_arguments(up)
    gateway_config.add_arguments(up)
    add_option(up, "--data-dir", "EMBEDFLEET_DATA_DIR", ".embedfleet", "folder for the embedded nats-server's data and logs")

    gw = sub.add_parser("gateway", help="run the HTTP gateway")
    add_common_arguments(gw)
    gateway_config.add_arguments(gw)

    reindex = sub.add_parser("reindex", help="embed a file of documents as a bulk job (JetStream), resumable")
    add_common_arguments(reindex)
    reindex.add_argument("input", help="documents: .jsonl ({\"id\", \"text\"}), .parquet (id, text) or text, one a line")
    reindex.add_argument("--out", required=True,
                         help="output: .npy (with .ids.json beside it) or .parquet; .npz for sparse and multivector")
    add_option(reindex, "--model", "EMBEDFLEET_MODEL_NAME", "all-MiniLM-L6-v2", "the served model id")
    add_option(reindex, "--batch-size", "EMBEDFLEET_JOB_BATCH", 64, "documents per job batch", positive_int)
    add_option(reindex, "--input-type", "EMBEDFLEET_INPUT_TYPE", None, "query or document (selects the model's prompt)")
    add_option(reindex, "--embedding-type", "EMBEDFLEET_EMBEDDING_TYPE", "float",
               "vector form written: float (float32), float16, int8, uint8, binary or ubinary (see the README)",
               choices=tuple(EMBEDDING_TYPES))
    add_option(reindex, "--output", "EMBEDFLEET_JOB_OUTPUT", "dense",
               "what to write: dense vectors, sparse vectors (SPLADE, BGE-M3) or multivector (a vector per token); "
               "sparse and multivector go to .npz", choices=("dense", "sparse", "multivector"))
    reindex.add_argument("--job-id", default=None,
                         help="job id (default: derived from the input, model and form, so a rerun resumes)")
    add_option(reindex, "--stall-timeout", "EMBEDFLEET_STALL_TIMEOUT", 300.0, "give up after this many seconds without progress",
               positive_float)
    reindex.add_argument("--quiet", action="store_true", help="no progress bar")
    add_retention_arguments(reindex)

    jobs = sub.add_parser("jobs", help="list bulk jobs with their progress, rate and ETA, or act on one")
    add_common_arguments(jobs)
    actions = jobs.add_subparsers(dest="jobs_command", metavar="ACTION")
    purge = actions.add_parser("purge", help="remove a job's results, dead letters and record")
    add_action_arguments(purge)
    purge.add_argument("job", help="the job id")
    purge.add_argument("--force", action="store_true", help="purge a job that has not finished too")
    cancel = actions.add_parser("cancel", help="stop a job: nothing more of it is published or computed; what was "
                                "stored stays until purged")
    add_action_arguments(cancel)
    cancel.add_argument("job", help="the job id")

    check = sub.add_parser("check", help="tell whether model folders will serve, and how (family, pooling, dims, backends)")
    check.add_argument("folders", nargs="+", metavar="MODEL_DIR", help="local Hugging Face model folders")
    check.add_argument("--json", action="store_true", help="one JSON object per folder")

    auth = sub.add_parser("auth", help="write a nats-server authorization (an nkey user per role, each allowed only "
                          "its own subjects) and each role's seed file, then exit")
    auth.add_argument("folder", help="where to write auth.conf (for the server) and <role>.nk (one per role)")
    add_option(auth, "--subject-prefix", "EMBEDFLEET_SUBJECT_PREFIX", "embedfleet", "NATS subject prefix")
    auth.add_argument("--force", action="store_true", help="replace the seeds already in the folder")

    init = sub.add_parser("init", help="create the JetStream streams and the job bucket (idempotent), then exit")
    add_common_arguments(init)
    add_retention_arguments(init)

    for name, module, text in (
        ("tokenizer", tokenizer_config, "run a tokenizer"),
        ("worker", worker_config, "run a worker (the engine; CUDA when present, else CPU)"),
        ("scorer", scorer_config, "run a scorer (reranking)"),
    ):
        p = sub.add_parser(name, help=text)
        add_common_arguments(p)
        add_model_arguments(p)
        module.add_arguments(p)
        tracing.add_arguments(p)
    for p in (up, gw, reindex):
        tracing.add_arguments(p)
    return parser


def add_action_arguments(parser: argparse.ArgumentParser) -> None:
    """The common options, accepted again after an action of ``jobs``: one not given there keeps the
    value given before the action (or its default) instead of resetting it."""
    add_common_arguments(parser)
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            action.default = argparse.SUPPRESS


def main(argv: list[str] | None = None) -> None:
    try:
        ns = build_parser().parse_args(argv)
        _dispatch(ns, argv)
    except ConfigError as exc:
        print(f"embedfleet: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)


def _dispatch(ns: argparse.Namespace, argv: list[str] | None) -> None:
    command = ns.command
    if command == "check":
        from services.check import main as check

        sys.exit(check(ns.folders, ns.json))
    if command == "auth":
        sys.exit(_write_auth(ns))
    if command == "up":
        from services.stack import run_stack

        sys.exit(run_stack(ns))
    setup_logging(ns.log_level, command, ns.log_format)
    if command in ("reindex", "jobs", "init"):
        from services.job_cancel import cancel
        from services.jobs_admin import list_jobs, purge_job
        from services.reindex import init_jetstream, reindex

        cfg = nats_config(ns)
        run = {"reindex": lambda: reindex(ns, cfg), "jobs": lambda: list_jobs(cfg),
               "jobs purge": lambda: purge_job(cfg, ns.job, ns.force), "jobs cancel": lambda: cancel(cfg, ns.job),
               "init": lambda: init_jetstream(cfg, retention(ns))}
        action = getattr(ns, "jobs_command", None)
        sys.exit(run_async(run[f"{command} {action}" if action else command]()))
    if command == "gateway":
        from services.gateway.app import serve

        serve(gateway_config.GatewayConfig.from_namespace(ns), ns.log_level)
    elif command == "tokenizer":
        from services.tokenizer.service import TokenizerService

        cfg = tokenizer_config.TokenizerConfig.from_namespace(ns)
        cfg.apply_threads()
        run_service("tokenizer", cfg.nats, lambda nc: TokenizerService(nc, cfg))
    elif command == "worker":
        # GNU OpenMP's threads spin 300,000 times after each parallel region before they sleep: a few
        # ms here, so an engine thread between two queries holds a core that the gateway, tokenizer
        # and NATS need on a shared machine, and is preempted by them in the next batch, which then
        # waits at every barrier. 3,000 spins still cover the gaps between one forward's ops. Read
        # when torch loads OpenMP, so set before that; an explicit GOMP_SPINCOUNT wins.
        os.environ.setdefault("GOMP_SPINCOUNT", "3000")
        from services.gpu_worker.replicas import build_engines, is_cpu, replica_threads, run_cpu_processes
        from services.gpu_worker.service import WorkerService

        cfg = worker_config.WorkerConfig.from_namespace(ns)
        # oneDNN keeps one primitive per GEMM shape (1024 by default): batches of every token count
        # made a worker's memory climb under steady traffic. The engine pads CPU batches to a
        # multiple of 8 tokens, and 256 primitives hold every shape a query or a batch needs: memory
        # stays bounded and a query rarely pays a primitive's creation (~1 ms at 64 primitives).
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "256")
        if cfg.replicas > 1 and is_cpu(cfg):
            sys.exit(run_cpu_processes(cfg, sys.argv[1:] if argv is None else argv))
        threads = replica_threads(cfg.replicas)
        # load weights (and calibrate) before taking work, on the thread that will run the engine
        engines = threads[0].submit(build_engines, cfg).result()
        run_service("worker", cfg.nats, lambda nc: WorkerService(nc, cfg, engines, threads))
    elif command == "scorer":
        from services.scorer.service import ScorerService

        cfg = scorer_config.ScorerConfig.from_namespace(ns)
        run_service("scorer", cfg.nats, lambda nc: ScorerService(nc, cfg))


def _write_auth(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from shared.permissions import ROLES, write_auth
    from shared.subjects import Subjects

    folder = Path(ns.folder)
    existing = [r for r in ROLES if (folder / f"{r}.nk").exists()]
    if existing and not ns.force:
        raise ConfigError(f"{folder} already holds seeds ({', '.join(existing)}.nk): give --force to replace them "
                          "(every process using them must then get the new ones)")
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
