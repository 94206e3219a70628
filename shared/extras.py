"""Which extra installs a third-party module, and the error a command meets when that extra is missing.

Each role's image installs its own extra only (pyproject.toml, deploy/docker/Dockerfile): the gateway's
holds no torch, the worker's no starlette. A command started where its extra is not installed says which
extra to install instead of ending in an ImportError's traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from embedfleet.shared.config.option import ConfigError

# top-level module -> the extra (pyproject.toml) that installs it
EXTRAS: dict[str, str] = {
    "starlette": "gateway",
    "uvicorn": "gateway",
    "httptools": "gateway",
    "pydantic": "gateway",
    "pydantic_core": "gateway",
    "jinja2": "tokenizer",
    "PIL": "tokenizer",  # Pillow: images decoded and prepared (two-tower models)
    "torch": "worker",
    "pyarrow": "jobs",
    "opentelemetry": "tracing",
    "kitoken": "fast-tokenizer",
    "flashinfer": "cuda",
    "psycopg": "sinks",
    "pgvector": "sinks",
    "lancedb": "sinks",
    "qdrant_client": "sinks",
    "pgserver": "local-pgvector",
}


class MissingExtra(ConfigError):
    """A module an extra installs is not installed here; the message says which extra to install."""

    def __init__(self, module: str, what: str) -> None:
        extra = EXTRAS[module.partition(".")[0]]
        super().__init__(
            f"{what} needs {module}, which the extra '{extra}' installs: pip install 'embedfleet[{extra}]'"
        )
        self.extra = extra


def missing_extra(exc: ModuleNotFoundError, what: str) -> MissingExtra | None:
    """``exc`` as a MissingExtra naming ``what`` needed it, when an extra installs the missing module;
    None for any other module (a broken install: its traceback says more)."""
    name = exc.name or ""
    return MissingExtra(name, what) if name.partition(".")[0] in EXTRAS else None


def imported(module: str, what: str) -> ModuleType:
    """``module``, imported; MissingExtra naming ``what`` when its extra is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (missing := missing_extra(exc, what)) is None:
            raise
        raise missing from None


def installed(module: str) -> bool:
    """Whether ``module`` imports here (a module an extra installs: the caller offers what it serves
    only where it does)."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError:
        return False
    return True
