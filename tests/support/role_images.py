"""Each role's process as its image holds it: the modules of the packages other roles' images install
and its own does not (torch outside the worker, starlette outside the gateway...) refused at import.

The images are read from deploy/docker/Dockerfile (bench/image_sizes.py) and the packages from the
installed project's metadata, so a role that imports what its extra does not declare fails the tests
that start it this way; tests/support/role_site/sitecustomize.py does the refusing.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import os
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement

from bench.image_sizes import images

SITE = Path(__file__).resolve().parent / "role_site"
# every virtualenv's own (python -m venv installs them; a .pth loads _distutils_hack before any test code)
VENV = frozenset({"pip", "setuptools", "pkg_resources", "_distutils_hack"})


def _name(dist: str) -> str:
    return dist.lower().replace("_", "-").replace(".", "-")


def _requires(dist: str, extras: frozenset[str]) -> set[tuple[str, frozenset[str]]]:
    """The distributions ``dist`` with ``extras`` requires directly, each with the extras it asks of them
    (a requirement whose marker holds for none of ``extras``, nor for none at all, left out)."""
    out = set()
    for text in md.requires(dist) or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in {"", *extras}):
            out.add((_name(req.name), frozenset(req.extras)))
    return out


@functools.cache
def closure(extras: frozenset[str]) -> frozenset[str]:
    """Every installed distribution ``embedfleet[extras]`` brings in, the project's own extras resolved."""
    seen: set[str] = set()
    todo = [("embedfleet", extras)]
    while todo:
        dist, want = todo.pop()
        for name, wanted in _requires(dist, want):
            if name == "embedfleet":
                todo.append((name, wanted))
            elif name not in seen:
                try:
                    md.distribution(name)
                except md.PackageNotFoundError:
                    continue  # a platform's own (its marker false here)
                seen.add(name)
                todo.append((name, wanted))
    return frozenset(seen)


@functools.cache
def _modules_of() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, dists in md.packages_distributions().items():
        for dist in dists:
            out.setdefault(_name(dist), set()).add(module)
    return out


@functools.cache
def absent_modules(role: str) -> frozenset[str]:
    """The top-level modules some image installs and ``role``'s does not."""
    built = images()
    mine = closure(frozenset(built[role].extras))
    others = set().union(*(closure(frozenset(i.extras)) for i in built.values())) - mine
    modules = _modules_of()
    return (
        frozenset(m for dist in others for m in modules.get(dist, ()))
        - {m for dist in mine for m in modules.get(dist, ())}
        - VENV
    )


def role_env(role: str) -> dict[str, str]:
    """The environment that starts a process of ``role`` as its image holds it."""
    return absent_env(absent_modules(role))


def absent_env(modules: Iterable[str]) -> dict[str, str]:
    """The environment that starts a process in which the top-level ``modules`` are not installed."""
    path = os.pathsep.join(p for p in (str(SITE), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "EMBEDFLEET_TEST_ABSENT": ",".join(sorted(modules))}


# installed here for the tests and benchmarks, by no role's image: nats-py imports it at start when it is
# there (its WebSocket transport, which embedfleet never uses), some 0.1-0.3 s of CPU per process that no
# deployed process pays
NOT_IN_ANY_IMAGE = frozenset({"aiohttp"})


def as_deployed(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` for a service or command process, with what no image installs (``NOT_IN_ANY_IMAGE``) absent
    as well as what ``env`` already leaves out (``role_env``, ``absent_env``)."""
    env = dict(env or {})
    absent = NOT_IN_ANY_IMAGE | set(filter(None, env.get("EMBEDFLEET_TEST_ABSENT", "").split(",")))
    path = [p for p in env.get("PYTHONPATH", os.environ.get("PYTHONPATH", "")).split(os.pathsep) if p]
    return {
        **env,
        "PYTHONPATH": os.pathsep.join([str(SITE), *(p for p in path if p != str(SITE))]),
        "EMBEDFLEET_TEST_ABSENT": ",".join(sorted(absent)),
    }
