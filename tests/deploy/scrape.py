"""deploy/prometheus/kubernetes.yml's scrape job, run where there is no Kubernetes: the pods that
deploy/k8s renders become static targets carrying the ``__meta_kubernetes_*`` labels Kubernetes' pod
discovery gives them, so the job's own relabelling picks the targets, their addresses and labels.

(Debian's Prometheus is built without Kubernetes discovery: its promtool refuses
``kubernetes_sd_configs``, so the job is checked with static targets in its place.)"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import yaml

from tests.deploy.manifests import ROOT, pod_templates

PATH = ROOT / "deploy" / "prometheus" / "kubernetes.yml"
JOB = "embedfleet"


def load() -> dict:
    return yaml.safe_load(PATH.read_text())


def job(config: dict) -> dict:
    (found,) = [j for j in config["scrape_configs"] if j["job_name"] == JOB]
    return found


def _name(key: str) -> str:
    """A Kubernetes label or annotation key as discovery writes it into a label name."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def discovered(docs: list[dict], ip: str, ports: dict[str, int] | None = None) -> list[dict]:
    """static_configs for the pods of ``docs`` as the pod role discovers them: one target a container
    port (one a container without ports), named ``<workload>-0`` at ``ip``; ``ports`` replaces the
    prometheus.io/port annotation of the named workloads (a local process serves on a port of its own)."""
    groups = []
    for doc, template in pod_templates(docs):
        name, meta = doc["metadata"]["name"], template.get("metadata", {})
        annotations = dict(meta.get("annotations", {}))
        if ports and name in ports and "prometheus.io/port" in annotations:
            annotations["prometheus.io/port"] = str(ports[name])
        pod = {
            "__meta_kubernetes_namespace": doc["metadata"].get("namespace", "default"),
            "__meta_kubernetes_pod_name": f"{name}-0",
            "__meta_kubernetes_pod_ip": ip,
            "__meta_kubernetes_pod_phase": "Running",
            **{f"__meta_kubernetes_pod_label_{_name(k)}": v for k, v in meta.get("labels", {}).items()},
            **{f"__meta_kubernetes_pod_annotation_{_name(k)}": v for k, v in annotations.items()},
        }
        for container in template["spec"]["containers"]:
            labels = {**pod, "__meta_kubernetes_pod_container_name": container["name"]}
            for port in container.get("ports") or [None]:
                address = ip if port is None else f"{ip}:{port['containerPort']}"
                if port is not None:
                    labels = {
                        **labels,
                        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
                    }
                groups.append({"targets": [address], "labels": labels})
    return groups


def local_config(config: dict, targets: list[dict], interval: str = "15s") -> dict:
    """``config`` with its scrape job's Kubernetes discovery replaced by ``targets``, scraped every ``interval``."""
    local = copy.deepcopy(config)
    local["global"] = {**local.get("global", {}), "scrape_interval": interval, "evaluation_interval": interval}
    scrape = job(local)
    del scrape["kubernetes_sd_configs"]
    scrape["static_configs"] = targets
    return local


def write(config: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
