"""The engine's modules import one way: the registry imports the model families, which import the
spec; the spec imports neither, not even inside a function (no cycle to break that way)."""

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "services" / "gpu_worker" / "engine"


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_the_spec_imports_no_family_and_no_registry():
    engine_imports = {m for m in _imported(ENGINE / "spec.py") if m.startswith("embedfleet.services.gpu_worker")}
    assert engine_imports == set(), engine_imports
    for family in (ENGINE / "models").glob("*.py"):
        if family.name != "registry.py":
            assert "embedfleet.services.gpu_worker.engine.models.registry" not in _imported(family), family.name
