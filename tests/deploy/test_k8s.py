"""deploy/: every kustomization renders (kubectl kustomize) and validates against the Kubernetes
schemas offline (kubernetes-validate, strict: unknown fields are errors); the manifests agree with
the code (environment variables, the bulk consumer KEDA watches, commands, probes); the Dockerfiles
build from files that exist and run as a non-root user."""

from __future__ import annotations

import re

import pytest

from bench import image_sizes
from embedfleet.shared.config.registry import COMMANDS, env_names
from embedfleet.shared.jobs.streams import stream_names
from embedfleet.shared.nats.lifecycle import DRAIN_TIMEOUT, STOP_TIMEOUT
from embedfleet.shared.nats.subjects import Subjects, model_token
from tests.deploy.manifests import ROOT, render

pytestmark = pytest.mark.slow

KUSTOMIZATIONS = ["base", "overlays/dev", "overlays/prod"]
K8S_VERSION = "1.31.0"
CRDS = {("keda.sh/v1alpha1", "ScaledObject")}  # not in the Kubernetes schemas: checked below by hand


def env_names_by_command() -> dict[str, set[str]]:
    """Every environment variable each ``embedfleet`` command reads, from the options' declarations."""
    return {command: env_names(command) for command in COMMANDS}


def containers(docs: list[dict]):
    for doc in docs:
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec") or spec.get("jobTemplate", {}).get("spec", {}).get(
            "template", {}
        ).get("spec")
        for c in (pod or {}).get("containers", []):
            yield doc, pod, c


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_renders_and_validates_against_kubernetes_schemas(path):
    import kubernetes_validate

    docs = render(path)
    assert docs
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRDS:
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path}: {doc['kind']}/{doc['metadata']['name']}: {exc}")


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_env_var_in_the_manifests_is_read_by_the_service(path):
    docs = render(path)
    known = env_names_by_command()
    maps = {
        (d["kind"], d["metadata"]["name"]): {**d.get("data", {}), **d.get("stringData", {})}
        for d in docs
        if d["kind"] in ("ConfigMap", "Secret")
    }
    checked = 0
    for doc, _, c in containers(docs):
        if not c["image"].startswith("ghcr.io/embedfleet/"):
            continue
        command = c["args"][0]
        assert command in known, f"{doc['metadata']['name']}: unknown command {command!r}"
        names = {e["name"] for e in c.get("env", [])}
        for source in c.get("envFrom", []):
            ref = source.get("configMapRef") or source.get("secretRef")
            kind = "ConfigMap" if "configMapRef" in source else "Secret"
            names |= set(maps[(kind, ref["name"])])
        unknown = names - known[command]
        assert not unknown, f"{doc['metadata']['name']} ({command}) sets {sorted(unknown)}, which it does not read"
        checked += 1
    assert checked >= 5  # init, gateway, tokenizer, scorer, worker


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_services_have_probes_and_outlast_their_drain(path):
    docs = render(path)
    for doc, pod, c in containers(docs):
        if not c["image"].startswith("ghcr.io/embedfleet/") or doc["kind"] == "Job":
            continue
        probe = c["readinessProbe"]
        ready_file = _env(c, docs)["EMBEDFLEET_READY_FILE"]
        assert probe.get("exec", {}).get("command") == ["test", "-f", ready_file], doc["metadata"]["name"]
        # after SIGTERM services give in-flight work STOP_TIMEOUT and NATS DRAIN_TIMEOUT: the grace
        # outlasts both, by a margin, not by minutes (a drained pod holds no work; a long grace slows rollouts)
        drain = STOP_TIMEOUT + DRAIN_TIMEOUT
        assert drain < pod["terminationGracePeriodSeconds"] <= drain + 15, doc["metadata"]["name"]
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True


def _env(container: dict, docs: list[dict]) -> dict[str, str]:
    env = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env |= next(
                d["data"]
                for d in docs
                if d["kind"] == "ConfigMap" and d["metadata"]["name"] == source["configMapRef"]["name"]
            )
    env |= {e["name"]: e.get("value") for e in container.get("env", [])}
    return env


def test_prod_puts_one_worker_on_each_gpu_and_scales_on_the_bulk_lag():
    docs = render("overlays/prod")
    worker = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpu-worker")
    pod = worker["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    assert c["image"].endswith("-cuda") and _env(c, docs)["EMBEDFLEET_DEVICE"] == "cuda"

    config = {
        k: v
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("embedfleet-")
        for k, v in d["data"].items()
    }
    subjects = Subjects(config["EMBEDFLEET_SUBJECT_PREFIX"])
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == "gpu-worker"
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "nats-jetstream"
    # the stream and durable consumer the workers really use (services/gpu_worker/bulk.py)
    assert trigger["metadata"]["stream"] == stream_names(subjects)["bulk"]
    assert trigger["metadata"]["consumer"] == f"workers-{model_token(config['EMBEDFLEET_MODEL_NAME'])}"
    assert trigger["metadata"]["natsServerMonitoringEndpoint"].startswith("nats.")


@pytest.mark.parametrize("path,servers", [("overlays/dev", 1), ("overlays/prod", 3)])
def test_nats_has_jetstream_on_disk_and_the_protocols_payload_limit(path, servers):
    from embedfleet.shared.nats.server import MAX_PAYLOAD

    docs = render(path)
    nats = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "nats")
    assert nats["spec"]["replicas"] == servers
    conf = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "nats-config")["data"][
        "nats.conf"
    ]
    assert f"max_payload: {MAX_PAYLOAD}" in conf and "store_dir: /data/jetstream" in conf
    assert ("cluster {" in conf) == (servers > 1)
    if servers > 1:
        assert conf.count("nats://nats-") == servers


@pytest.mark.parametrize("path,servers", [("overlays/dev", 1), ("overlays/prod", 3)])
def test_clients_know_every_nats_node_and_the_streams_survive_one_nodes_loss(path, servers):
    from urllib.parse import urlsplit

    from embedfleet.shared.nats.config import NatsConfig

    docs = render(path)
    values = {
        k: v
        for d in docs
        if d["kind"] in ("ConfigMap", "Secret") and d["metadata"]["name"].startswith("embedfleet-")
        for k, v in {**d.get("data", {}), **d.get("stringData", {})}.items()
    }
    url = values["EMBEDFLEET_NATS_URL"]
    NatsConfig(url=url, subjects=Subjects("embedfleet"))  # as the services read it
    hosts = [urlsplit(u).hostname for u in url.split(",")]
    assert hosts == [f"nats-{i}.nats-headless.embedfleet.svc.cluster.local" for i in range(servers)]
    # three copies where three nodes run: a majority (two) survives one node's loss
    assert int(values["EMBEDFLEET_STREAM_REPLICAS"]) == min(3, servers)
    nats = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "nats")
    (c,) = nats["spec"]["template"]["spec"]["containers"]
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"  # a restarted node serves once caught up


@pytest.mark.parametrize(
    ("dockerfile", "target"), [*(("Dockerfile", role) for role in image_sizes.ROLES), ("cuda.Dockerfile", None)]
)
def test_dockerfiles_copy_real_files_and_run_as_non_root(dockerfile, target):
    path = ROOT / "deploy" / "docker" / dockerfile
    found = image_sizes.stages(path)
    for stage in found.values():
        for args in stage.values("COPY"):
            if "--from" not in args:
                for source in args.split()[:-1]:
                    assert (ROOT / source).exists(), f"{dockerfile}: COPY {source}: no such file"
    final = target or list(found)[-1]
    user = image_sizes.inherited(found, final, "USER")
    assert user and not user.startswith(("0", "root")), "the image must run as a non-root user"
    assert image_sizes.inherited(found, final, "ENTRYPOINT") == '["embedfleet"]'
    command = re.match(r'\["(\w+)"', image_sizes.inherited(found, final, "CMD") or "").group(1)
    assert command in env_names_by_command()


@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_container_runs_the_image_of_its_command(path):
    """A role's pod runs its role's image (tag 0.1.0-ROLE; the GPU worker's 0.1.0-cuda): the image
    whose extra holds what that command imports."""
    built = image_sizes.images()
    commands = {f"0.1.0-{role}": image.command[0] for role, image in built.items()}
    commands["0.1.0-cuda"] = image_sizes.cuda_image().command[0]
    checked = 0
    for doc, _, c in containers(render(path)):
        if c["image"].startswith("ghcr.io/embedfleet/"):
            tag = c["image"].rpartition(":")[2]
            assert tag in commands, f"{doc['metadata']['name']}: {c['image']} is no image deploy/docker builds"
            assert c["args"][0] == commands[tag], (doc["metadata"]["name"], c["image"], c["args"])
            checked += 1
    assert checked >= 5


def test_the_declared_commands_are_the_clis():
    from embedfleet.services.cli.main import HELP

    assert set(HELP) == {c for c in COMMANDS if " " not in c}


@pytest.mark.parametrize("overlay", ["dev", "prod"])
def test_the_docs_own_overlay_points_every_embedfleet_container_at_your_registry(overlay, tmp_path):
    """docs/kubernetes.md, "From an empty cluster to a first answer", step 2, as written there, with plain kubectl: the images of your registry, the tags kept."""
    import os
    import subprocess

    import yaml

    page = (ROOT / "docs" / "kubernetes.md").read_text()
    steps = page.split("## From an empty cluster to a first answer", 1)[1]
    block = re.search(r"```yaml\n(\s*resources:\n.*?)```", steps, re.S).group(1)
    kustomization = yaml.safe_load(block)
    assert kustomization["resources"] == ["RELATIVE/PATH/TO/embedfleet/deploy/k8s/overlays/dev"]
    kustomization["resources"] = [os.path.relpath(ROOT / "deploy" / "k8s" / "overlays" / overlay, tmp_path)]
    kustomization["images"][0]["newName"] = "registry.example/embedfleet"  # the page's REGISTRY
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    out = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    images = {c["image"] for _, _, c in containers([d for d in yaml.safe_load_all(out.stdout) if d])}
    roles = {"gateway", "tokenizer", "scorer", "jobs"} | ({"cuda"} if overlay == "prod" else {"worker"})
    want = {f"registry.example/embedfleet:0.1.0-{role}" for role in roles}
    assert {i for i in images if "embedfleet" in i} == want
