"""The Kubernetes manifests of deploy/k8s as kubectl renders them, and the pods they make."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"


def render(path: str) -> list[dict]:
    """The documents of the kustomization at ``deploy/k8s/<path>``."""
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is needed to render the manifests (Debian: apt install kubectl)")
    out = subprocess.run(["kubectl", "kustomize", str(K8S / path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def pod_templates(docs: list[dict]) -> Iterator[tuple[dict, dict]]:
    """(workload, its pod template: metadata and spec) for every Deployment, StatefulSet, Job, CronJob."""
    for doc in docs:
        spec = doc.get("spec", {})
        template = spec.get("template") or spec.get("jobTemplate", {}).get("spec", {}).get("template")
        if template:
            yield doc, template
