"""`embedfleet up`'s start-up: what it refuses before anything starts (a data folder it cannot write, a
port another process holds), and what it supervises once users can reach the stack (a death then is
restarted, not a failed start)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from embedfleet.shared.model_dir.folder import default_model_path
from embedfleet.shared.nats.server import free_port
from tests.integration.test_up import FIXED_BUDGET, _child, _start_up, _stop
from tests.support.procs import healthy, wait_until

pytestmark = pytest.mark.integration

UP = [sys.executable, "-m", "embedfleet.services.cli", "up"]


def _refused(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """`up` with ``args`` (under ``prefix``, a command that runs it) expected to refuse at once."""
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "EMBEDFLEET_NATS_URL")}
    return subprocess.run(
        [*prefix, *UP, *args], capture_output=True, text=True, timeout=120, env={**env, **FIXED_BUDGET}
    )


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    """The one line `up` said on stderr, held to a CLI error's shape: exit 2, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("embedfleet: error: "), result.stderr
    return lines[0]


@pytest.mark.parametrize("case", ["under a file", "a file in its place"])
def test_up_refuses_a_data_folder_it_cannot_create(tmp_path, case):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder\n")
    data = a_file / "data" if case == "under a file" else a_file
    line = _one_error_line(_refused("--data-dir", str(data), "--port", str(free_port())))
    assert f"the data folder {data} cannot be used: " in line, line
    assert ("Not a directory" if case == "under a file" else "a file is in its place") in line, line
    assert a_file.read_text() == "not a folder\n"


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) for a read-only mount")
def test_up_refuses_a_read_only_data_folder(tmp_path):
    """A data folder on a read-only mount (a tmpfs mounted read-only in a user namespace of its own,
    which no root can write): up says so in one line (it used to end in an OSError's traceback from
    up.lock), and starts no nats-server."""
    data = tmp_path / "ro"
    data.mkdir()
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o ro tmpfs {data} && touch {data}/x"],
        capture_output=True,
        text=True,
    )
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"no read-only mount in a user namespace here: {probe.stderr.strip()}")
    mount = ("unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o ro tmpfs {data} && exec "$@"', "up")
    line = _one_error_line(_refused("--data-dir", str(data), "--port", str(free_port()), prefix=mount))
    assert f"the data folder {data} cannot be used: Read-only file system ({data / 'up.lock'})" in line, line


def _listening(host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.bind((host, 0))
    s.listen()
    return s


def _this_process() -> str:
    return Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def test_up_refuses_a_port_in_use_naming_its_holder(tmp_path):
    """--port held by another process (this test): refused before anything starts (no nats-server: its
    folder is never made), naming the port, the address and the holder's pid and command line."""
    with _listening() as held:
        port = held.getsockname()[1]
        line = _one_error_line(_refused("--data-dir", str(tmp_path / "data"), "--port", str(port)))
        assert f"port {port} on 127.0.0.1 is in use by pid {os.getpid()} ({_this_process()})" in line, line
        assert not (tmp_path / "data" / "nats").exists()
        # a fixed --metrics-port (the gateway's own) is checked the same way
        line = _one_error_line(
            _refused("--data-dir", str(tmp_path / "data"), "--port", str(free_port()), "--metrics-port", str(port))
        )
        assert f"--metrics-port: port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in line, line
        assert not (tmp_path / "data" / "nats").exists()


def test_up_names_the_port_taken_while_it_started(tmp_path):
    """The port free when up looked, taken before the gateway binds it (here: by this test, as soon as
    up's nats-server listens): the gateway still fails, and up's own error line names the port and who
    holds it, not only an exit status."""
    port = free_port()
    proc, log = _start_up(tmp_path, "--port", str(port), env=FIXED_BUDGET)
    taker = socket.socket()
    try:
        wait_until(lambda: "nats-server listening" in log.read_text() or proc.poll() is not None, 60, "nats-server")
        taker.bind(("127.0.0.1", port))  # before the gateway's Python has imported its server
        taker.listen()
        try:
            code = proc.wait(240)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"up still runs 240 s after its port was taken:\n{log.read_text()[-4000:]}") from None
        out = log.read_text()
        assert code == 1, out[-3000:]
        assert (
            f"gateway exited with 3 during start-up: port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in out
        ), out[-3000:]
    finally:
        taker.close()
        if proc.poll() is None:
            _stop(proc)


def _embed(base: str, model: str, text: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/embeddings", json={"model": model, "input": text}, timeout=150)


def test_a_worker_killed_once_users_are_served_is_started_again_while_up_still_starts(tmp_path):
    """Two models: the first one's worker is ready and answers users while up still starts the second
    one's. SIGKILLed then (as the OOM killer would), it is started again as a death after start-up
    is, not taken for a failed start that ends the stack; a request sent at once is answered."""
    folder = default_model_path()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc, log = _start_up(
        tmp_path,
        "--port",
        str(port),
        "--model",
        f"first={folder}",
        "--model",
        f"second={folder}",
        "--request-timeout",
        "150",
        env=FIXED_BUDGET,
    )
    try:
        wait_until(lambda: _serves(base, "first") or proc.poll() is not None, 180, "the first model served")
        assert proc.poll() is None, log.read_text()
        assert _embed(base, "first", "first answer").status_code == 200
        workers = _workers(proc.pid)
        first = workers["first"]
        os.kill(first, signal.SIGKILL)
        assert "embedfleet is up" not in log.read_text(), "up was past its start-up: nothing tested"
        started = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            r = pool.submit(_embed, base, "first", "at once").result()
        took = time.monotonic() - started
        out = log.read_text()
        assert r.status_code == 200, (r.text, out[-3000:])
        assert proc.poll() is None, out[-3000:]
        assert "worker[first] exited with -9; starting it again" in out, out[-3000:]
        assert "during start-up" not in out, out[-3000:]
        wait_until(lambda: "embedfleet is up" in log.read_text() or proc.poll() is not None, 180, "the whole stack")
        assert proc.poll() is None, log.read_text()[-3000:]
        assert _embed(base, "second", "the second model").status_code == 200
        print(f"the request sent as the worker died was answered in {took:.1f}s")
    finally:
        assert _stop(proc) == 0, log.read_text()[-3000:]


def _serves(base: str, model: str) -> bool:
    """Whether the gateway at ``base`` says ``model`` is ready (a live tokenizer and worker)."""
    try:
        return httpx.get(f"{base}/health", params={"model": model}, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _workers(up: int) -> dict[str, int]:
    """The worker processes `up` started: model id -> pid (from their --model-name)."""
    out = subprocess.run(
        ["pgrep", "-P", str(up), "-f", "embedfleet.services.cli worker"], capture_output=True, text=True
    ).stdout
    found = {}
    for pid in map(int, out.split()):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        found[args[args.index("--model-name") + 1]] = pid
    return found


def test_a_worker_killed_as_the_stack_first_answers_is_started_again(tmp_path):
    """One model: the worker SIGKILLed the moment /health and a first request are answered (up may still
    be confirming that the gateway lists the model): it is started again, and a request sent at once
    is answered; up never calls it a failed start."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc, log = _start_up(tmp_path, "--port", str(port), "--request-timeout", "150", env=FIXED_BUDGET)
    try:
        wait_until(lambda: healthy(base) or proc.poll() is not None, 180, "health")
        assert proc.poll() is None, log.read_text()
        assert _embed(base, "all-MiniLM-L6-v2", "first").status_code == 200
        os.kill(_child(proc.pid, "worker"), signal.SIGKILL)
        r = _embed(base, "all-MiniLM-L6-v2", "at once")
        out = log.read_text()
        assert r.status_code == 200, (r.text, out[-3000:])
        assert "worker[all-MiniLM-L6-v2] exited with -9; starting it again" in out, out[-3000:]
        wait_until(lambda: "embedfleet is up" in log.read_text() or proc.poll() is not None, 180, "the stack")
        out = log.read_text()
        assert "during start-up" not in out and proc.poll() is None, out[-3000:]
    finally:
        assert _stop(proc) == 0, log.read_text()[-3000:]
