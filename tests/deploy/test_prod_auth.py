"""The prod overlay's least privilege: every embedfleet container connects as its own role's NATS
user, with the seed `embedfleet auth` wrote mounted from that role's Secret; the gateway asks for API
keys; NATS includes the authorization, and the server (the real binary, in its config-test mode)
accepts the rendered config with a real `embedfleet auth` output beside it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from embedfleet.shared.nats.server import find_binary
from tests.deploy.manifests import render

pytestmark = pytest.mark.slow

# the role whose user each command connects as (shared/permissions.py's roles)
ROLE_OF = {"gateway": "gateway", "tokenizer": "tokenizer", "worker": "worker", "scorer": "scorer", "init": "operator"}


@pytest.fixture(scope="module")
def prod() -> list[dict]:
    return render("overlays/prod")


def _containers(docs: list[dict]):
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec")
        for c in (spec or {}).get("containers", []):
            if c["image"].startswith("ghcr.io/embedfleet/"):
                yield spec, c


def _secret_behind(spec: dict, container: dict, path: str) -> str | None:
    """The Secret whose volume is mounted at the folder holding ``path``."""
    folder = path.rsplit("/", 1)[0]
    for mount in container.get("volumeMounts", []):
        if mount["mountPath"] == folder:
            volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
            return volume.get("secret", {}).get("secretName")
    return None


def test_every_container_connects_as_its_roles_user(prod):
    seen = set()
    for spec, c in _containers(prod):
        command = c["args"][0]
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        seed = env.get("EMBEDFLEET_NATS_NKEY_SEED")
        assert seed, f"{command}: no NATS seed"
        assert _secret_behind(spec, c, seed) == f"embedfleet-nats-{ROLE_OF[command]}", command
        seen.add(command)
    assert seen == set(ROLE_OF)


def test_the_gateway_asks_for_api_keys_from_a_secret(prod):
    ((spec, gateway),) = [(s, c) for s, c in _containers(prod) if c["args"][0] == "gateway"]
    keys = {e["name"]: e.get("value") for e in gateway["env"]}["EMBEDFLEET_API_KEYS_FILE"]
    assert _secret_behind(spec, gateway, keys) == "embedfleet-api-keys"


@pytest.mark.parametrize("overlay, includes", [("overlays/prod", True), ("overlays/dev", False), ("base", False)])
def test_nats_includes_the_authorization_where_it_should_and_the_server_accepts_it(overlay, includes, tmp_path):
    docs = render(overlay)
    conf = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "nats-config")["data"][
        "nats.conf"
    ]
    assert ("include ../nats-auth/auth.conf" in conf) == includes
    if not includes:
        return
    nats = next(d for d in docs if d["kind"] == "StatefulSet")
    mounts = {m["mountPath"]: m["name"] for m in nats["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in nats["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts["/etc/nats-auth"]]["secret"]["secretName"] == "nats-auth" and "/etc/nats" in mounts
    # the folders as the pod has them: the config in nats/, the Secret's auth.conf beside it in nats-auth/
    (tmp_path / "nats").mkdir()
    (tmp_path / "nats" / "nats.conf").write_text(conf)
    made = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", "auth", str(tmp_path / "nats-auth")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    check = subprocess.run(
        [find_binary(), "-t", "-c", str(tmp_path / "nats" / "nats.conf")],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "POD_NAME": "nats-0"},
    )
    assert check.returncode == 0, check.stdout + check.stderr
    (tmp_path / "nats-auth" / "auth.conf").write_text("authorization { users = [ {nkey: ")  # a broken one is refused
    broken = subprocess.run(
        [find_binary(), "-t", "-c", str(tmp_path / "nats" / "nats.conf")],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "POD_NAME": "nats-0"},
    )
    assert broken.returncode != 0
