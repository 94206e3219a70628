"""The README's two commands do all of the set-up: `make test` installs what its tests need, and CI's
entry point (.ci/run) runs `make test` and adds no install step of its own."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "setup" / "system-packages.sh"


def commands(path: Path) -> list[str]:
    """The lines of a shell script that run something (comments and blank lines dropped)."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_ci_runs_make_test_and_installs_nothing():
    lines = commands(ROOT / ".ci" / "run")
    assert any(re.match(r"make test\b", line) for line in lines), lines
    installs = [line for line in lines if re.search(r"apt-get|apt |pip |dnf |yum |npm |curl |wget ", line)]
    assert installs == [], f".ci/run installs what make test should: {installs}"


def test_make_test_runs_the_system_packages_step_first():
    out = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    setup = next(i for i, line in enumerate(lines) if "tests/setup/system-packages.sh" in line)
    pytest_run = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert setup < pytest_run, out.stdout


def test_make_test_runs_the_static_checks_before_pytest():
    """make lint (ruff's lint and format check, and mypy, configured in pyproject.toml) runs before the suite, from the venv the test
    extra installs them into: a lint error fails make test without the suite's minutes."""
    out = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "test"], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    ruff = lines.index(".venv/bin/ruff check .")
    formatted = lines.index(".venv/bin/ruff format --check .")
    mypy = next(i for i, line in enumerate(lines) if line.startswith(".venv/bin/mypy"))
    pytest_run = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert max(ruff, formatted, mypy) < pytest_run, out.stdout
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert {re.split(r"[<>=]", spec)[0] for spec in extra} >= {"ruff", "mypy"}, extra


def test_make_run_installs_the_local_pgvector_only_when_asked():
    """`make run ARGS=...--with-pgvector...` installs the extra local-pgvector (once: a stamp) before
    `embedfleet up`; a plain `make run` never does. -B: every step shown, whatever is installed here."""

    def steps(*args: str) -> list[str]:
        # --no-print-directory: under `make test` this make is nested, and would say where it enters and leaves
        out = subprocess.run(
            ["make", "--no-print-directory", "-n", "-B", "run", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.splitlines()

    extra = "-m pip install --quiet -e '.[all,local-pgvector]'"
    assert not any(extra in line for line in steps()) and not any(extra in line for line in steps("ARGS=--port 9090"))
    for args in ("--with-pgvector", "--port 9090 --with-pgvector"):
        lines = steps(f"ARGS={args}")
        install = next(i for i, line in enumerate(lines) if extra in line)
        assert lines[install + 1] == "touch .venv/.pgvector-installed", lines
        assert lines[-1] == f".venv/bin/embedfleet up {args}" and install < len(lines) - 1, lines


def test_the_test_programs_are_there_after_make_test():
    # make test ran the set-up before this suite: what it installs is on PATH
    missing = [name for name in ("prometheus", "promtool") if shutil.which(name) is None]
    assert missing == [], f"make test did not install {missing}"


def test_the_set_up_does_nothing_when_all_is_there(tmp_path):
    # stand-ins for installed programs: the script must not reach apt-get (absent from this PATH)
    for name in ("prometheus", "promtool"):
        stub = tmp_path / name
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}
    out = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


def test_the_set_up_names_what_to_install_where_it_cannot(tmp_path):
    # no prometheus and no apt-get on this PATH: a clear message, and make test goes on (the tests then fail
    # naming the missing program)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "id", "sudo"):
        found = shutil.which(name)
        if found:
            (bin_dir / name).symlink_to(found)
    env = {**os.environ, "PATH": str(bin_dir)}
    out = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "prometheus" in out.stderr and ("apt-get" in out.stderr or "Prometheus 2.x" in out.stderr), out.stderr
