"""The gateway's uvicorn server, in a process of its own: idle, it wakes about once a second (not ten
times); its Date header still follows the clock; SIGTERM stops it at once, not at its next tick."""

from __future__ import annotations

import email.utils
import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from embedfleet.shared.nats.server import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

_SERVE = textwrap.dedent("""
    import sys
    import uvicorn
    from embedfleet.services.gateway.http import uvicorn as uvicorn_server

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    uvicorn_server.TICK = float(sys.argv[2])
    uvicorn_server.run(uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning"))
""")


def _serve(tick: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(port), str(tick)], cwd=os.getcwd())
    url = f"http://127.0.0.1:{port}/"

    def up() -> bool:
        try:
            return httpx.get(url, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 30, "the server answering")
    return proc, url


def _wakes(pid: int) -> int:
    """The main thread's voluntary context switches so far: each is a sleep that ended."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


def test_an_idle_server_wakes_about_once_a_second_and_keeps_its_date_header_current():
    proc, url = _serve(1.0)
    try:
        before = _wakes(proc.pid)
        time.sleep(5.0)
        assert _wakes(proc.pid) - before <= 15  # uvicorn's own loop: 50 and more
        date = email.utils.parsedate_to_datetime(httpx.get(url, timeout=5).headers["date"]).timestamp()
        assert abs(date - time.time()) < 3.0
    finally:
        proc.terminate()
        proc.wait(30)


def test_sigterm_stops_the_server_at_once_not_at_its_next_tick():
    proc, _ = _serve(60.0)  # a tick a minute: only the wake-up by the signal can stop it in time
    try:
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == -signal.SIGTERM  # uvicorn raises the signal again once shut down, as before
        assert time.monotonic() - sent < 10.0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
