"""deploy/grafana/embedfleet.json read the way the tests need it: its panels, their queries, the metric
selectors in each query, and the queries with Grafana's variables filled in."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

from tests.deploy.manifests import ROOT

PATH = ROOT / "deploy" / "grafana" / "embedfleet.json"
# a metric name, then its label matchers if any: embedfleet_x_total{model=~"$model", queue="bulk"}
SELECTOR = re.compile(r"\b(embedfleet_[a-z0-9_]+)\b(\{[^}]*\})?")


@dataclass(frozen=True)
class Query:
    panel: str  # the panel's title
    ref: str  # the target's refId
    expr: str

    def selectors(self) -> Iterator[tuple[str, str]]:
        """(metric name, its matchers as written, "" when none) for each metric the query reads."""
        for m in SELECTOR.finditer(self.expr):
            yield m.group(1), m.group(2) or ""

    def filled(self, model: str, rate_interval: str) -> str:
        """The query as Grafana sends it with one ``model`` chosen (a name with no regex metacharacters:
        ``$model`` sits in regex matchers, where Grafana would escape them)."""
        return self.expr.replace("$__rate_interval", rate_interval).replace("$model", model)

    def __str__(self) -> str:
        return f"{self.panel} [{self.ref}]: {self.expr}"


def load() -> dict:
    return json.loads(PATH.read_text())


def panels(dashboard: dict) -> list[dict]:
    """Every panel but the rows (which only group), those inside collapsed rows included."""
    out = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            out += panel.get("panels", [])
        else:
            out.append(panel)
    return out


def queries(dashboard: dict) -> list[Query]:
    return [Query(p["title"], t["refId"], t["expr"]) for p in panels(dashboard) for t in p["targets"]]


def variable(dashboard: dict, name: str) -> dict:
    (found,) = [v for v in dashboard["templating"]["list"] if v["name"] == name]
    return found
