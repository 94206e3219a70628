"""``embedfleet check``: every family's folder is said to serve, with its facts; a folder that cannot
serve is refused with what is missing, as the worker would refuse it at start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from embedfleet.services.cli.check import check_folder
from tests.support.tiny_models import FAMILIES, build

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("check")
    return {f: build(f, root) for f in FAMILIES} | {"qwen3-cls": build("qwen3", root, classifier=True, num_labels=2)}


@pytest.mark.parametrize(
    "name, family, pooling, attention",
    [
        ("bert", "BERT", "mean", "bidirectional"),
        ("mpnet", "MPNet", "mean", "bidirectional, relative-position bias"),
        ("modernbert", "ModernBERT", "mean", "bidirectional; bidirectional, window ±4"),
        ("qwen3", "Qwen3", "lasttoken", "causal"),
        ("gemma3", "Gemma3", "mean", "bidirectional, window ±4; bidirectional"),
        ("gte", "GTE", "cls", "bidirectional"),
        ("nomic_bert", "NomicBERT", "mean", "bidirectional"),
        (
            "gemma2",
            "Gemma2",
            "lasttoken",
            "causal, window -7, scores capped at ±2 (tanh); causal, scores capped at ±2 (tanh)",
        ),
    ],
)
def test_each_family_serves_and_says_how(folders, name, family, pooling, attention):
    report = check_folder(str(folders[name]))
    assert report.ok, report.error
    assert report.facts["family"].startswith(family)
    assert report.facts["output"].startswith(f"pooling {pooling}")
    assert report.facts["attention"] == attention
    assert report.facts["max tokens"] == 256


def test_gemma3_stack_prompts_and_dtype(folders):
    facts = check_folder(str(folders["gemma3"])).facts
    assert facts["output"] == "pooling mean -> dense 64->256 (identity) -> dense 256->64 (identity) -> normalize"
    assert "query='task: search result | query: '" in facts["prompts"]
    assert "float32 (float16 overflows" in facts["dtype"]
    assert facts["backend (cpu)"] == "sdpa (eager)"


def test_classifier_is_reported_as_such(folders):
    facts = check_folder(str(folders["qwen3-cls"])).facts
    assert facts["task"] == "classifier, 2 logit(s)"


def test_llm_reranker_is_described(tmp_path):
    from tests.support.tiny_llm_rerankers import build_llm_reranker, reference

    folder = build_llm_reranker(tmp_path, "qwen3")
    model = reference(folder)
    yes, no = model[1].true_token_id, model[1].false_token_id
    report = check_folder(str(folder))
    assert report.ok, report.error
    assert (
        report.facts["task"]
        == f"LLM reranker: logit['yes' ({yes})] - logit['no' ({no})] at the last token, sigmoid by default"
    )
    assert report.facts["pairs"].startswith("chat template (flat messages: query, document), ")
    # the template's tail; Jinja drops a template's last newline, in transformers as here
    assert report.facts["after the document"] == repr("<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n")


def test_unsupported_model_type_is_named(folders, tmp_path):
    import shutil

    folder = tmp_path / "t5"
    shutil.copytree(folders["bert"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "t5"}))
    report = check_folder(str(folder))
    assert not report.ok and "model_type 't5' is not supported (supported: bert," in report.error


def test_missing_tensor_is_named(folders, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "broken"
    shutil.copytree(folders["qwen3"], folder)
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    report = check_folder(str(folder))
    assert not report.ok and report.error == "checkpoint is missing tensor 'layers.1.mlp.up_proj.weight'"


def test_command_exit_codes_and_json(folders, tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", "check", str(folders["mpnet"]), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    (report,) = json.loads(ok.stdout)
    assert report["ok"] and report["facts"]["family"] == "MPNet (model_type mpnet)"
    bad = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", "check", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "cannot serve" in bad.stdout and "config.json is missing" in bad.stdout


@pytest.mark.parametrize("role", ["worker", "tokenizer"])
def test_services_refuse_an_unservable_folder_at_start(folders, tmp_path, role):
    """The same refusal at start, before any request: exit code 2 and the reason on stderr."""
    import shutil

    folder = tmp_path / "odd-pooling"
    shutil.copytree(folders["mpnet"], folder)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "attention"}))
    result = subprocess.run(
        [sys.executable, "-m", "embedfleet.services.cli", role, "--model", str(folder), "--nats", "nats://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "pooling mode 'attention' is not supported" in result.stderr


def test_the_docs_table_is_the_registry():
    from pathlib import Path

    from embedfleet.services.gpu_worker.engine.models.registry import markdown_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text()
    assert markdown_table() in page, "docs/models.md's Supported models table differs from models/registry.py"


def test_gemma3_in_float16_computes_in_float32_and_says_so(folders, caplog):
    import logging

    from embedfleet.services.gpu_worker.engine import Engine
    from embedfleet.shared.model_dir.load import load_model_info

    with caplog.at_level(logging.WARNING, logger="embedfleet.engine"):
        engine = Engine(load_model_info(str(folders["gemma3"])), "cpu", "float16")
    assert engine.dtype_name == "float32"
    assert [r.getMessage() for r in caplog.records] == [
        "Gemma3 activations overflow float16: computing in float32 (ask for bfloat16 for half precision)"
    ]
