"""deploy/grafana/embedfleet.json: a well-formed Grafana dashboard (unique panel ids, a layout without
overlaps, every query on the chosen data source), whose queries parse as PromQL (promtool), read only
metrics the services' registries define (a rename breaks this test) and chart every one of them.
tests/integration/test_dashboard.py runs its queries against a real Prometheus scraping a real stack."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from prometheus_client import CollectorRegistry

from embedfleet.services.gateway.metrics import Metrics
from embedfleet.services.gpu_worker.metrics import WorkerMetrics
from embedfleet.services.gpu_worker.scheduler import Scheduler
from embedfleet.services.scorer.metrics import ScorerMetrics
from embedfleet.services.tokenizer.metrics import TokenizerMetrics
from tests.deploy import dashboard as dash
from tests.integration.prometheus_server import binary

# the series each metric type exposes (prometheus_client names a counter's family without _total)
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def registries() -> dict[str, CollectorRegistry]:
    return {
        "gateway": Metrics().registry,
        "tokenizer": TokenizerMetrics("m").registry,
        "worker": WorkerMetrics("m", Scheduler(64, 8), 64).registry,
        "scorer": ScorerMetrics("m", "bi-encoder", lambda: 0).registry,
    }


def series_names() -> dict[str, str]:
    """Every series name the services expose -> its metric family's name."""
    names = {}
    for registry in registries().values():
        for family in registry.collect():
            for suffix in SUFFIXES[family.type]:
                names[family.name + suffix] = family.name
    return names


@pytest.fixture(scope="module")
def board() -> dict:
    return dash.load()


def test_dashboard_has_its_variables(board):
    assert board["schemaVersion"] >= 39 and board["uid"] == "embedfleet" and board["title"]
    source = dash.variable(board, "datasource")
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    model = dash.variable(board, "model")
    assert model["type"] == "query" and model["datasource"] == DATASOURCE
    assert model["multi"] and model["includeAll"]
    metric = re.fullmatch(r"label_values\((embedfleet_\w+), model\)", model["definition"]).group(1)
    assert metric in series_names()
    assert model["query"]["query"] == model["definition"]


def test_every_panel_has_an_id_a_place_and_queries(board):
    ids = [p["id"] for p in board["panels"]] + [p["id"] for r in board["panels"] for p in r.get("panels", [])]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {sorted(ids)}"
    cells: dict[tuple[int, int], str] = {}
    for panel in board["panels"]:
        g = panel["gridPos"]
        assert all(isinstance(g[k], int) for k in ("h", "w", "x", "y")), panel["title"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, f"{panel['title']}: off the 24 columns"
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]
    for panel in dash.panels(board):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']}: no queries"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["expr"].strip(), panel["title"]


def test_queries_use_the_rate_interval_and_parse_as_promql(board, tmp_path):
    queries = dash.queries(board)
    for q in queries:
        windows = re.findall(r"\[([^\]]*)\]", q.expr)
        assert all(w == "$__rate_interval" for w in windows), f"{q}: a window other than $__rate_interval"
    # every query as a recording rule: promtool parses each one's PromQL
    rules = [{"record": f"check:{i}", "expr": q.filled("all-MiniLM-L6-v2", "1m")} for i, q in enumerate(queries)]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run([binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr


def test_queries_read_only_metrics_the_services_define(board):
    known = series_names()
    unknown = sorted(
        {f"{name} ({q.panel})" for q in dash.queries(board) for name, _ in q.selectors() if name not in known}
    )
    assert not unknown, f"the dashboard reads metrics no service defines: {unknown}"


def test_every_metric_is_on_the_dashboard(board):
    known = series_names()
    charted = {known[name] for q in dash.queries(board) for name, _ in q.selectors() if name in known}
    missing = sorted(set(known.values()) - charted)
    assert not missing, f"metrics no panel charts: {missing}"


def test_no_series_carries_a_label_prometheus_gives_its_targets():
    """``job`` and ``instance`` name the scrape job and target; a series with either would be renamed
    (``exported_job``) by a Prometheus that does not honour the services' labels."""
    reserved = {"job", "instance"}
    clashes = [
        (family._name, label)
        for registry in registries().values()
        for family in registry._collector_to_names
        for label in getattr(family, "_labelnames", ())
        if label in reserved
    ]
    assert not clashes, clashes
