"""A service command before it has NATS: with nothing given and no stack recorded it ends within seconds
saying what to do; with a URL given it retries, and SIGTERM stops it in every state of that wait."""

from __future__ import annotations

import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from embedfleet.shared.nats.server import free_port
from tests.support.procs import Service, one_shot, port_open, wait_until

pytestmark = pytest.mark.integration

SERVICES = ("gateway", "tokenizer", "worker", "scorer")
STOPPED_WITHIN = 5.0  # seconds from SIGTERM to exit, on a loaded two-core machine


def test_a_service_given_no_nats_and_no_stack_ends_naming_where_it_looked(tmp_path):
    """No URL, no credential, no `up` recorded: the default URL tried for a few seconds, not forever,
    and one line saying where a stack was looked for and what to give."""
    if port_open(4222):
        pytest.skip("a NATS on the default port would answer the default URL")
    empty = tmp_path / "empty"
    with ThreadPoolExecutor(2) as pool:
        results = list(
            pool.map(lambda role: one_shot([role, "--data-dir", str(empty)], cwd=tmp_path, timeout=90), SERVICES)
        )
    records = empty / "stack.json"  # the folder named, alone
    for role, (result, took) in zip(SERVICES, results):
        assert result.returncode == 2, (role, result.stderr[-2000:])
        assert result.stderr.splitlines()[-1] == (
            f"embedfleet: error: no NATS server at nats://127.0.0.1:4222 (the default; no running `embedfleet up` "
            f"recorded in {records}): start `embedfleet up`, or give --nats URL"
        ), role
        assert "Traceback" not in result.stderr and took < 30, (role, took)


def _refused(service: Service) -> bool:
    return "Connection refused" in service.log()


def _stopped_within(service: Service, seconds: float) -> float | None:
    """SIGTERM ``service``; the seconds it took to exit, None when it still ran after ``seconds``."""
    sent = time.monotonic()
    service.proc.send_signal(signal.SIGTERM)
    try:
        service.proc.wait(seconds)
    except subprocess.TimeoutExpired:
        service.kill()
        return None
    return time.monotonic() - sent


def test_sigterm_stops_a_service_while_it_waits_for_a_nats_given(tmp_path):
    """--nats given (Kubernetes: NATS may come up later) and refusing: the service retries, and a
    SIGTERM ends it within seconds whether it is starting, has just been refused, or has been retrying
    for a while. The gateway connects in uvicorn's start-up, which a signal alone does not end."""
    dead = f"nats://127.0.0.1:{free_port()}"
    roles = ("scorer", "gateway")
    services = {
        (role, moment): Service(role, ["--nats", dead], tmp_path)
        for role in roles
        for moment in ("refused", "retrying")
    }
    took: dict[tuple[str, str], float | None] = {}
    try:
        for role in roles:  # at once: while Python still imports the service's code
            services[(role, "starting")] = Service(role, ["--nats", dead], tmp_path)
            took[(role, "starting")] = _stopped_within(services[(role, "starting")], STOPPED_WITHIN)
        for role in roles:  # its first connection just refused
            service = services[(role, "refused")]
            wait_until(lambda s=service: _refused(s), 60, f"{role} refused", [service])
            took[(role, "refused")] = _stopped_within(service, STOPPED_WITHIN)
        time.sleep(3)  # the state under test is time passing: retries and the pauses between them
        for role in roles:
            service = services[(role, "retrying")]
            assert _refused(service) and service.alive, service.log()[-2000:]
            took[(role, "retrying")] = _stopped_within(service, STOPPED_WITHIN)
    finally:
        for service in services.values():
            service.kill()
    slow = {case: services[case].log()[-1500:] for case, seconds in took.items() if seconds is None}
    assert not slow, slow
