"""The gateway's --allowed-hosts in the Kubernetes manifests: every name its Service is reached by, and
its probes (by the pod's address), pass the Host check; any other name is refused (DNS rebinding)."""

from __future__ import annotations

import pytest

from embedfleet.services.gateway.config import comma_list
from embedfleet.services.gateway.http.browser import rules_of
from tests.deploy.manifests import pod_templates, render

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("path", ["base", "overlays/dev", "overlays/prod"])
def test_the_service_names_and_the_probes_pass_the_host_check(path):
    docs = render(path)
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "gateway"]
    namespace = service["metadata"]["namespace"]
    ((_, template),) = [(w, t) for w, t in pod_templates(docs) if w["metadata"]["name"] == "gateway"]
    (container,) = template["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    rules = rules_of(comma_list(env.get("EMBEDFLEET_ALLOWED_HOSTS", "")), (), container["args"][-1])
    name = service["metadata"]["name"]
    port = service["spec"]["ports"][0]["port"]
    for host in (name, f"{name}.{namespace}", f"{name}.{namespace}.svc", f"{name}.{namespace}.svc.cluster.local"):
        for shown in (host, f"{host}:{port}"):  # port 80: clients leave it out
            assert rules.host_allowed(shown), (path, shown)
    assert rules.host_allowed("localhost:8080")  # kubectl port-forward
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        get = container.get(probe, {}).get("httpGet")
        if get is not None:  # the kubelet's Host: the pod's address (or the probe's host), its port
            assert "httpHeaders" not in get or all(h["name"].lower() != "host" for h in get["httpHeaders"])
            assert rules.host_allowed(f"{get.get('host', '10.244.3.17')}:8080"), (path, probe)
    for host in ("evil.example", f"{name}.evil.example", "gateway.other.svc.cluster.local"):
        assert not rules.host_allowed(host), (path, host)
