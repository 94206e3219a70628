"""What ``embedfleet up`` runs: the models it serves, and the processes each one needs.

Every model gets a tokenizer and a worker process of its own (see docs/models.md, "Several models"); a model
the scorer can rank with (a one-label cross-encoder: its scores; an embedder of dense vectors: cosine)
gets a scorer too; one gateway stands in front of all of them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.config.registry import option
from embedfleet.shared.model_dir.info import ModelInfo, same_model
from embedfleet.shared.model_dir.load import load_model_info
from embedfleet.shared.nats.subjects import model_token
from embedfleet.shared.observability.metrics_server import MetricsEndpoint


@dataclass(frozen=True, slots=True)
class Child:
    """One process of the stack: ``embedfleet <role> <args>``, which writes ``ready`` once it serves."""

    name: str  # in logs: "gateway", "worker[bge-small]"
    role: str
    args: tuple[str, ...]
    ready: Path
    metrics: str | None = None  # the URL of its Prometheus metrics


def split_entry(text: str) -> tuple[str | None, str]:
    """'[ID=]DIR' -> (id or None, folder); a folder that exists is taken whole, '=' and all."""
    text = text.strip()
    if "=" in text and not Path(text).expanduser().is_dir():
        model_id, folder = text.split("=", 1)
        if not model_id.strip() or not folder.strip():
            raise ConfigError(f"--model {text!r}: give ID=DIR, or DIR alone")
        return model_id.strip(), folder.strip()
    return None, text


def _entries(ns: argparse.Namespace) -> list[tuple[str | None, str]]:
    entries = [split_entry(e) for e in ns.model or ()]
    if ns.models_file:
        entries += read_models_file(Path(ns.models_file))
    return entries


def read_models_file(path: Path) -> list[tuple[str | None, str]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"--models-file {path}: {exc.strerror}") from None
    entries = []
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            model_id, folder = split_entry(line)
            entries.append((model_id, str(path.parent / Path(folder).expanduser())))
    if not entries:
        raise ConfigError(f"--models-file {path} names no model")
    return entries


def served_models(ns: argparse.Namespace) -> list[ModelInfo]:
    """The models ``up`` serves, in the order given, their folders read (a bad one fails here, before
    any process starts); none given: the shipped default model."""
    entries = _entries(ns)
    if ns.model_name is not None:
        if len(entries) > 1:
            raise ConfigError(
                "--model-name names the one model served; with several, give each its id as --model ID=DIR"
            )
        if entries and entries[0][0] is not None:
            raise ConfigError(f"--model-name {ns.model_name!r} and --model {entries[0][0]}=...: give the id once")
    if not entries:
        return [load_model_info(None, ns.model_name)]
    infos = [load_model_info(folder, model_id or ns.model_name) for model_id, folder in entries]
    for i, a in enumerate(infos):
        for b in infos[:i]:
            if same_model(a.id, b.id) or model_token(a.id) == model_token(b.id):
                raise ConfigError(
                    f"two models would be served as {b.id!r} ({b.path} and {a.path}): "
                    "give one another id with --model ID=DIR"
                )
    return infos


def default_model(ns: argparse.Namespace, infos: list[ModelInfo]) -> ModelInfo:
    """The model of requests that name none (TEI routes): --default-model, else the first one given."""
    if ns.default_model is None:
        return infos[0]
    for info in infos:
        if same_model(ns.default_model, info.id):
            return info
    raise ConfigError(
        f"--default-model {ns.default_model!r} is none of the models served: {', '.join(i.id for i in infos)}"
    )


def roles(info: ModelInfo) -> tuple[str, ...]:
    """The processes a model needs. The scorer ranks with a one-label cross-encoder's scores or with
    an embedder's dense vectors; a classifier (several labels) or a sparse-only model has none."""
    ranks = info.dim == 1 if info.scores else "dense" in info.outputs
    return ("tokenizer", "worker", "scorer") if ranks else ("tokenizer", "worker")


def with_search_store(
    ns: argparse.Namespace, url: str, table: str, infos: list[ModelInfo], default: ModelInfo
) -> argparse.Namespace:
    """``ns`` whose gateway searches ``table`` of the store at ``url`` (postgresql://...?host=...) with the
    default model (else the first that makes dense vectors), unless --search-sink names another store;
    a --search-model given stays; None makes dense vectors: no search. POST /v1/jobs may write into the
    store (its ``"sink"``), unless --job-sinks names others."""
    ns = argparse.Namespace(**{**vars(ns), "job_sinks": ns.job_sinks or url})
    model = next((i for i in (default, *infos) if i.task == "embed" and "dense" in i.outputs), None)
    if ns.search_sink is not None or model is None:
        return ns
    return argparse.Namespace(
        **{**vars(ns), "search_sink": f"{url}&table={table}", "search_model": ns.search_model or model.id}
    )


def secret_environment(ns: argparse.Namespace) -> dict[str, str]:
    """The gateway's API keys (and operator keys) and its search store's URL (which may hold a password) given to
    ``up``, for the children's environment: an argument would show them to every user of the machine (ps,
    /proc/PID/cmdline), as a NATS token would."""
    given = {
        option(dest).env[0]: getattr(ns, dest, None) or ""
        for dest in ("api_keys", "operator_keys", "search_sink", "job_sinks")
    }
    return {name: value for name, value in given.items() if value}


def children(
    infos: list[ModelInfo],
    common: list[str],
    gateway: list[str],
    ready_dir: Path,
    more: Mapping[str, list[str]] | None = None,
) -> list[Child]:
    """Every process of the stack, the gateway last, each with its own ready file under ``ready_dir``;
    ``more``: a role's arguments besides ``common``."""
    more = more or {}
    plan = []
    for info in infos:
        for role in roles(info):
            ready = ready_dir / f"{role}-{model_token(info.id)}"
            args = (
                *common,
                "--ready-file",
                str(ready),
                "--model",
                str(info.path),
                "--model-name",
                info.id,
                *more.get(role, ()),
            )
            plan.append(Child(f"{role}[{info.id}]", role, args, ready))
    ready = ready_dir / "gateway"
    plan.append(Child("gateway", "gateway", (*common, "--ready-file", str(ready), *gateway), ready))
    return plan


def with_metrics(plan: list[Child], host: str, gateway: str, replicas: int, ports: Callable[[int], int]) -> list[Child]:
    """``plan`` with every process's metrics URL: the gateway's on its HTTP port (``gateway``, its base
    URL), every other process's on a port of its own, given as ``--metrics-port``; ``ports(n)`` is the
    first of n free ports in a row (a worker of ``replicas`` replicas on a CPU runs that many processes,
    the i-th on the first port + i)."""
    out = []
    for child in plan:
        if child.role == "gateway":
            out.append(replace(child, metrics=f"{gateway}/metrics"))
            continue
        endpoint = MetricsEndpoint(ports(replicas if child.role == "worker" else 1), host)
        args = (*child.args, "--metrics-port", str(endpoint.port), "--metrics-host", host)
        out.append(replace(child, args=args, metrics=endpoint.url()))
    return out
