"""`embedfleet up`: the whole local stack from one command, with and without an embedded nats-server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx
import nats
import numpy as np
import pytest

from embedfleet.shared.nats.lifecycle import DRAIN_TIMEOUT, STOP_TIMEOUT
from embedfleet.shared.nats.server import free_port
from tests.support.procs import healthy, one_shot, port_open, wait_until
from tests.support.prometheus_text import value

pytestmark = pytest.mark.integration


# the worker's token budget, given: only test_up_with_embedded_nats runs the start-up calibration
FIXED_BUDGET = {"EMBEDFLEET_MAX_BATCH_TOKENS": "2048"}


def _start_up(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "up.log"
    env = {**{k: v for k, v in os.environ.items() if k not in ("NATS_URL", "EMBEDFLEET_NATS_URL")}, **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedfleet.services.cli", "up", "--data-dir", str(tmp_path / "data"), *args],
        stdout=open(log, "wb"),  # noqa: SIM115 (the child holds it)
        stderr=subprocess.STDOUT,
        env=env,
    )
    return proc, log


def _metrics_urls(banner: str) -> dict[str, str]:
    """The metrics URLs `up` printed: process name -> URL."""
    block = banner.split("metrics (Prometheus), one URL a process:\n", 1)[1].split("Ctrl-C", 1)[0]
    return dict(line.split()[:2] for line in block.splitlines() if line.strip())


def _nats_refuses(url: str, token: str | None) -> bool:
    """Whether the server at ``url`` refuses a client that gives ``token`` (None: no credentials)."""

    async def connect() -> None:
        nc = await nats.connect(url, token=token, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3)
        await nc.close()

    try:
        asyncio.run(connect())
    except Exception as exc:
        return "Authorization Violation" in str(exc)
    return False


def _stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(60)


def test_up_with_embedded_nats(tmp_path):
    port = free_port()
    proc, log = _start_up(tmp_path, "--port", str(port))
    try:
        wait_until(lambda: "embedfleet is up" in log.read_text() or proc.poll() is not None, 120, "the stack")
        out = log.read_text()
        assert proc.poll() is None, out
        assert f"POST http://127.0.0.1:{port}/v1/embeddings" in out
        nats_port = int(out.split("NATS nats://127.0.0.1:")[1].split()[0])
        assert healthy(f"http://127.0.0.1:{port}")
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "hi"}, timeout=60
        )
        assert r.status_code == 200 and len(r.json()["data"][0]["embedding"]) == 384
        # every process's metrics URL, one a line; each answers with its own service's metrics
        urls = _metrics_urls(out)
        model = "all-MiniLM-L6-v2"
        assert set(urls) == {"gateway", f"tokenizer[{model}]", f"worker[{model}]", f"scorer[{model}]"}, out
        assert urls["gateway"] == f"http://127.0.0.1:{port}/metrics"
        assert len(set(urls.values())) == 4
        for name, url in urls.items():
            text = httpx.get(url, timeout=10).text
            assert (
                "embedfleet_requests_total" if name == "gateway" else f"embedfleet_{name.split('[')[0]}_"
            ) in text, name
        worker = httpx.get(urls[f"worker[{model}]"], timeout=10).text
        assert (
            value(worker, "embedfleet_worker_tokens_total", model=model, queue="online")
            == r.json()["usage"]["prompt_tokens"]
        )
        # the embedded server asks for a token made for this run, kept in a file only its owner reads,
        # handed to the services in their environment: printed nowhere, in no process's arguments
        token_file = tmp_path / "data" / "nats" / "token"
        token = token_file.read_text().strip()
        assert f"--nats-token-file {token_file}" in out and token not in out and len(token) >= 40
        assert token_file.stat().st_mode & 0o077 == 0
        assert (tmp_path / "data" / "nats" / "nats-server.conf").stat().st_mode & 0o077 == 0
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert "embedfleet.services.cli worker" in ps and token not in ps
        assert _nats_refuses(f"nats://127.0.0.1:{nats_port}", None) and not _nats_refuses(
            f"nats://127.0.0.1:{nats_port}", token
        )
        # its data and log live under the project-owned data directory, the worker's calibration too
        assert (tmp_path / "data" / "nats" / "nats-server.conf").is_file()
        kept = [p.name for p in (tmp_path / "data" / "calibration").glob("*.json")]
        assert len(kept) == 1 and kept[0].startswith("all-MiniLM-L6-v2-cpu-float32-"), (kept, out)
        assert "listen: 127.0.0.1:" in (tmp_path / "data" / "nats" / "nats-server.conf").read_text()
    finally:
        code = _stop(proc)
    assert code == 0, log.read_text()[-3000:]
    # the child nats-server is gone with it
    deadline = time.monotonic() + 10
    while port_open(nats_port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not port_open(nats_port)


def test_up_with_external_nats_starts_none(tmp_path, nats_url):
    port = free_port()
    proc, log = _start_up(
        tmp_path, "--port", str(port), "--nats", nats_url, "--subject-prefix", "uptest", env=FIXED_BUDGET
    )
    try:
        wait_until(lambda: "embedfleet is up" in log.read_text() or proc.poll() is not None, 120, "the stack")
        assert proc.poll() is None, log.read_text()
        assert f"NATS {nats_url}" in log.read_text()
        assert not (tmp_path / "data" / "nats").exists()
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/embeddings",
            json={"model": "all-MiniLM-L6-v2", "input": ["a", "b"]},
            timeout=60,
        )
        assert r.status_code == 200 and len(r.json()["data"]) == 2
    finally:
        assert _stop(proc) == 0, log.read_text()[-3000:]


def test_up_gives_the_gateway_its_api_keys_in_no_argument(tmp_path, nats_url):
    """`up --api-keys` hands the keys to the gateway in its environment, as it does a NATS token: no
    process it starts shows them in its arguments (ps, /proc/PID/cmdline), and they still admit."""
    keys = [f"key-{uuid.uuid4().hex}", f"key-{uuid.uuid4().hex}"]
    port = free_port()
    proc, log = _start_up(
        tmp_path,
        "--port",
        str(port),
        "--nats",
        nats_url,
        "--subject-prefix",
        "upkeys",
        "--api-keys",
        ",".join(keys),
        env=FIXED_BUDGET,
    )
    try:
        wait_until(lambda: "embedfleet is up" in log.read_text() or proc.poll() is not None, 120, "the stack")
        assert proc.poll() is None, log.read_text()
        pids = _descendants(proc.pid)
        commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() for pid in pids}
        assert sum("embedfleet.services.cli gateway" in c for c in commands.values()) == 1, commands
        for command in commands.values():
            assert not any(key in command for key in keys), command
        url = f"http://127.0.0.1:{port}/v1/embeddings"
        body = {"model": "all-MiniLM-L6-v2", "input": "hi"}
        assert httpx.post(url, json=body, timeout=60).status_code == 401
        for key in keys:
            r = httpx.post(url, json=body, headers={"authorization": f"Bearer {key}"}, timeout=60)
            assert r.status_code == 200, r.text
        assert not any(key in log.read_text() for key in keys)
    finally:
        assert _stop(proc) == 0, log.read_text()[-3000:]


def test_reindex_and_jobs_find_the_stack_up_recorded(tmp_path):
    """`up` records its NATS URL and token file in its data folder while it runs; reindex and jobs,
    given no --nats, connect with them (flag --data-dir, or its variable); the record goes with `up`."""
    import json

    port = free_port()
    proc, log = _start_up(tmp_path, "--port", str(port), env=FIXED_BUDGET)
    record = tmp_path / "data" / "stack.json"
    try:
        wait_until(lambda: "embedfleet is up" in log.read_text() or proc.poll() is not None, 120, "the stack")
        assert proc.poll() is None, log.read_text()
        nats_url = "nats://127.0.0.1:" + log.read_text().split("NATS nats://127.0.0.1:")[1].split()[0]
        assert json.loads(record.read_text()) == {
            "url": nats_url,
            "token_file": str(tmp_path / "data" / "nats" / "token"),
            "pid": proc.pid,
            "default_model": "all-MiniLM-L6-v2",  # its gateway's, for commands given no model
        }
        docs = tmp_path / "docs.jsonl"
        docs.write_text("".join(json.dumps({"id": f"d{i}", "text": f"document number {i}"}) + "\n" for i in range(20)))
        out = tmp_path / "vectors.npy"
        result, _ = one_shot(["reindex", str(docs), "--out", str(out), "--quiet", "--data-dir", str(tmp_path / "data")])
        assert result.returncode == 0, result.stdout + result.stderr
        assert np.load(out).shape == (20, 384)
        listed, _ = one_shot(["jobs"], env={"EMBEDFLEET_DATA_DIR": str(tmp_path / "data")})
        assert listed.returncode == 0 and " done " in listed.stdout, listed.stdout + listed.stderr
    finally:
        assert _stop(proc) == 0, log.read_text()[-3000:]
    assert not record.exists()
    gone, took = one_shot(["jobs", "--data-dir", str(tmp_path / "data"), "--nats", nats_url])
    assert gone.returncode == 2 and f"cannot reach NATS at {nats_url} within 5s" in gone.stderr, gone.stderr
    assert took < 15, took


def test_one_shot_commands_give_up_on_an_unreachable_nats_naming_it(tmp_path):
    """No retrying forever: a NATS that refuses ends reindex, jobs and init within seconds (5 s of
    tries and a process start, bounded here for a loaded two-core machine), the URL named."""
    dead = f"nats://127.0.0.1:{free_port()}"
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "text": "hello"}\n')
    cases = [
        ["reindex", str(docs), "--out", str(tmp_path / "v.npy"), "--nats", dead],
        ["jobs", "--nats", dead],
        ["init", "--nats", dead],
        ["jobs", "cancel", "some-job", "--nats", dead],
        ["jobs", "fetch", "some-job", "--out", str(tmp_path / "f.npy"), "--nats", dead],
    ]
    # nothing given, nothing recorded: the default URL, and why it was tried (unless a NATS on the
    # default port of this machine would answer)
    default = not port_open(4222)
    if default:
        cases.append(["jobs", "--data-dir", str(tmp_path / "empty")])
    with ThreadPoolExecutor(2) as pool:  # two at a time: each mostly waits out its own 5 s
        results = list(pool.map(one_shot, cases))
    for args, (result, took) in zip(cases[:5], results):
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert f"embedfleet: error: cannot reach NATS at {dead} within 5s: " in result.stderr, result.stderr
        assert "given by --nats or the environment" in result.stderr and "Traceback" not in result.stderr
        assert took < 20, (args, took)
    if default:
        result, took = results[5]
        assert result.returncode == 2 and took < 20
        assert f"no running `embedfleet up` recorded in {tmp_path / 'empty' / 'stack.json'}" in result.stderr, (
            result.stderr
        )


def test_up_refuses_a_bad_model_folder(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", "up", "--model", str(tmp_path / "missing")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "is not a folder" in result.stderr and "Traceback" not in result.stderr


def _child(parent: int, role: str) -> int:
    out = subprocess.run(
        ["pgrep", "-P", str(parent), "-f", f"embedfleet.services.cli {role}"], capture_output=True, text=True
    )
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 1, (role, out)
    return pids[0]


def _logged_at(log: str, line: str, nth: int) -> float:
    """The time (epoch seconds) of the ``nth`` (from 1) log line holding ``line``."""
    stamps = [row[:23] for row in log.splitlines() if line in row]
    assert len(stamps) >= nth, (line, stamps)
    return datetime.strptime(stamps[nth - 1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_up_starts_a_dead_service_again(tmp_path):
    """A service of the local stack that dies (here the worker, SIGKILL) is started again by `up`; a
    request sent at once, its rows stranded with the dead worker, is answered once the new worker is
    ready; the stack serves again with no manual step."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc, log = _start_up(tmp_path, "--port", str(port), env=FIXED_BUDGET)
    try:
        wait_until(lambda: "embedfleet is up" in log.read_text() or proc.poll() is not None, 120, "the stack")
        assert proc.poll() is None, log.read_text()
        worker = _child(proc.pid, "worker")
        os.kill(worker, signal.SIGKILL)
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(
                httpx.post, f"{base}/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "at once"}, timeout=60
            )
            r = sent.result()
            answered = time.time()
        assert r.status_code == 200, r.text
        ready = _logged_at(log.read_text(), "INFO worker embedfleet: worker ready", 2)
        print(
            f"the request sent as the worker died was answered {answered - ready:.2f}s after the new worker was ready"
        )
        # ~1.3 s: a look at the fleet every 0.3 s shows the new worker, then the rows go again (2 cores, loaded)
        assert answered - ready < 3.0, log.read_text()[-3000:]
        assert "worker[all-MiniLM-L6-v2] exited with -9; starting it again" in log.read_text()
        wait_until(lambda: healthy(base) and _child(proc.pid, "worker") != worker, 120, "health with a new worker")
        r = httpx.post(f"{base}/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": "again"}, timeout=60)
        assert r.status_code == 200, r.text
        assert proc.poll() is None
    finally:
        assert _stop(proc) == 0, log.read_text()[-3000:]


def _descendants(pid: int) -> set[int]:
    """Every process under ``pid`` (children, their children, ...)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        out = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True).stdout
        kids = {int(p) for p in out.split()}
        todo += kids - found
        found |= kids
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def test_up_killed_outright_takes_its_stack_along(tmp_path):
    """A second `up` on the data folder of a running one fails at once naming the holder; `up` killed
    with SIGKILL leaves no nats-server or service behind, and frees its data folder."""
    port = free_port()
    proc, log = _start_up(tmp_path, "--port", str(port), env=FIXED_BUDGET)
    stack: set[int] = set()
    try:
        wait_until(lambda: "embedfleet is up" in log.read_text() or proc.poll() is not None, 120, "the stack")
        assert proc.poll() is None, log.read_text()
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "embedfleet.services.cli",
                "up",
                "--data-dir",
                str(tmp_path / "data"),
                "--port",
                str(free_port()),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 2, second.stderr
        assert f"the data folder {tmp_path / 'data'} is in use by pid {proc.pid} (" in second.stderr
        assert "embedfleet.services.cli up --data-dir" in second.stderr and "Traceback" not in second.stderr
        stack = _descendants(proc.pid)
        ps = subprocess.run(
            ["ps", "-o", "args=", "-p", ",".join(map(str, stack))], capture_output=True, text=True
        ).stdout
        assert "nats-server" in ps and ps.count("embedfleet.services.cli") == 4, ps
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # the services stop as on SIGTERM, their NATS server gone with them: within what a stop may take
        # (in-flight work, then the connection's drain), as a pod's grace period allows it (test_k8s); on
        # an idle machine in about 2 s
        started = time.monotonic()
        try:
            wait_until(
                lambda: not any(_running(pid) for pid in stack),
                STOP_TIMEOUT + DRAIN_TIMEOUT + 15,
                "the stack's processes to end",
            )
        except TimeoutError:
            left = [p for p in stack if _running(p)]
            ps = subprocess.run(
                ["ps", "-o", "pid,stat,args", "-p", ",".join(map(str, left))], capture_output=True, text=True
            )
            raise AssertionError(f"still running:\n{ps.stdout}\n{log.read_text()[-4000:]}") from None
        print(f"the stack ended {time.monotonic() - started:.1f}s after `up` was killed")
    finally:
        if proc.poll() is None:
            _stop(proc)
        for pid in stack:  # what this test failed to see end
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
    from embedfleet.services.up.lock import hold_data_dir

    hold_data_dir(tmp_path / "data").close()  # the kernel let go of the dead one's lock
