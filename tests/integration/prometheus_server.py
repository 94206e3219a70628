"""A real Prometheus server (Debian's `prometheus` package: /usr/bin/prometheus) on a free port, its
data in a folder of the test's, and the HTTP API calls the tests make of it."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from embedfleet.shared.nats.server import free_port
from tests.support.procs import wait_until


def binary(name: str) -> str:
    """The path of ``name`` (prometheus, promtool); a missing one fails the test: CI installs it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed: apt-get install prometheus (make test installs it: tests/setup/system-packages.sh)"
        )
    return path


def check_config(path: Path) -> None:
    """``promtool check config``: the file parses and its scrape jobs, relabelling included, are valid."""
    out = subprocess.run([binary("promtool"), "check", "config", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"promtool check config {path}:\n{out.stdout}{out.stderr}"


class Prometheus:
    """``config`` (a prometheus.yml as a dict) written to ``workdir``, checked and served."""

    def __init__(self, config: dict, workdir: Path) -> None:
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        check_config(self.config_path)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "prometheus.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (the process writes it until it stops)
        self.proc = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, timeout, "prometheus ready")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def api(self, path: str, **params) -> dict:
        """One call of the HTTP API (``/api/v1/<path>``); its ``data`` once it answers success."""
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body.get("status") == "success", f"{path} {params}: {r.status_code} {body}"
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """An instant query at now: the result's series, each {"metric": labels, "value": [t, "v"]}."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: a {data['resultType']}, not an instant vector"
        return data["result"]

    def targets(self) -> dict:
        return self.api("targets")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def finite(series: list[dict]) -> list[dict]:
    """The series of a query result whose value is a number (histogram_quantile of no data is NaN)."""
    return [s for s in series if math.isfinite(float(s["value"][1]))]
