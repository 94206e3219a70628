"""Prometheus scraping on Kubernetes: deploy/prometheus/kubernetes.yml (pod annotations) is a valid
config (promtool) watching the manifests' namespace, and the PodMonitor of deploy/k8s/monitoring (the
Prometheus Operator's way) selects exactly the pods the base manifests annotate for scraping, on a
port they name. tests/integration/test_dashboard.py runs the scrape job on a real Prometheus."""

from __future__ import annotations

import pytest

from tests.deploy import scrape
from tests.deploy.manifests import pod_templates, render
from tests.integration.prometheus_server import check_config

pytestmark = pytest.mark.slow

METRICS_PORT = "9100"  # deploy/k8s/base/config.yaml: EMBEDFLEET_METRICS_PORT


def matches(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against a pod's labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def scraped_pods(docs: list[dict]) -> dict[str, dict]:
    """Workload name -> pod template, for the pods annotated prometheus.io/scrape "true"."""
    return {
        doc["metadata"]["name"]: t
        for doc, t in pod_templates(docs)
        if t["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true"
    }


@pytest.fixture(scope="module")
def base() -> list[dict]:
    return render("base")


def test_the_annotated_pods_serve_metrics_on_the_annotated_port(base):
    pods = scraped_pods(base)
    assert set(pods) == {"gateway", "tokenizer", "scorer", "gpu-worker"}
    config = next(d for d in base if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "embedfleet-metrics")
    assert config["data"]["EMBEDFLEET_METRICS_PORT"] == METRICS_PORT
    for name, pod in pods.items():
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == METRICS_PORT, name
        ports = {p.get("name"): p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert ports.get("metrics") == int(METRICS_PORT), name


def test_kubernetes_scrape_config_is_valid_and_watches_the_namespace(base, tmp_path):
    config = scrape.load()
    job = scrape.job(config)
    namespace = {d["metadata"]["namespace"] for d in base if d["kind"] == "Deployment"}
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": sorted(namespace)}}]
    # the target's own labels (job, instance) stand: no series of the services' carries one of them
    assert not job.get("honor_labels")
    # Debian's promtool knows no Kubernetes discovery: the rest of the job, relabelling included, is checked
    check_config(scrape.write(scrape.local_config(config, scrape.discovered(base, "10.0.0.1")), tmp_path / "p.yml"))


@pytest.mark.parametrize("overlay", ["base", "overlays/dev", "overlays/prod"])
def test_podmonitor_selects_exactly_the_annotated_pods(overlay):
    docs = render(overlay)
    (monitor,) = render("monitoring")
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    namespaces = {d["metadata"]["namespace"] for d in docs if d["kind"] == "Deployment"}
    # no namespaceSelector: the PodMonitor's own namespace, the manifests' one
    assert "namespaceSelector" not in monitor["spec"] and namespaces == {monitor["metadata"]["namespace"]}
    selected = {
        doc["metadata"]["name"]
        for doc, t in pod_templates(docs)
        if matches(monitor["spec"]["selector"], t["metadata"].get("labels", {}))
    }
    pods = scraped_pods(docs)
    assert selected == set(pods), f"selects {sorted(selected)}; annotated for scraping: {sorted(pods)}"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics" and not endpoint.get("honorLabels")
    for name, pod in pods.items():
        named = {p.get("name"): str(p["containerPort"]) for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert named.get(endpoint["port"]) == pod["metadata"]["annotations"]["prometheus.io/port"], name


def test_label_selector_semantics():
    sel = {"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "In", "values": ["x", "y"]}]}
    assert matches(sel, {"a": "1", "b": "y"})
    for labels in ({"a": "1", "b": "z"}, {"a": "2", "b": "x"}, {"a": "1"}):
        assert not matches(sel, labels), labels
    assert matches({"matchExpressions": [{"key": "c", "operator": "DoesNotExist"}]}, {"a": "1"})
