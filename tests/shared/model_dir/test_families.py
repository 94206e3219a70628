"""The one list of model families and their model types: the engine's registry serves exactly it, and
the model-folder reading takes its defaults from it without importing torch."""

import subprocess
import sys
from pathlib import Path

import pytest

from embedfleet.shared.model_dir.families import FAMILY_TYPES, family_types, position_offset

ROOT = Path(__file__).resolve().parents[3]


def test_the_registry_serves_the_table_in_its_order():
    from embedfleet.services.gpu_worker.engine.models.registry import FAMILIES, SUPPORTED_TYPES

    assert [f.types for f in FAMILIES] == list(FAMILY_TYPES)
    assert tuple(t for f in FAMILY_TYPES for t in f.model_types) == SUPPORTED_TYPES
    assert len(set(SUPPORTED_TYPES)) == len(SUPPORTED_TYPES)  # a model type belongs to one family


@pytest.mark.parametrize(
    "config,offset",
    [
        ({"model_type": "xlm-roberta", "pad_token_id": 1}, 2),
        ({"model_type": "camembert"}, 2),  # transformers' default pad_token_id is 1
        ({"model_type": "roberta", "pad_token_id": 0}, 1),
        ({"model_type": "bert", "pad_token_id": 0}, 0),
        ({}, 0),  # BERT when config.json names no model_type
        ({"model_type": "qwen3"}, 0),
        ({"model_type": "mpnet", "pad_token_id": 5}, 2),  # MPNet's padding index is 1 whatever the config says
    ],
)
def test_position_offset_is_roberta_s_scheme_and_mpnet_s(config, offset):
    assert position_offset(config) == offset


def test_unknown_and_malformed_model_types_have_no_family():
    assert family_types("gemma3") is None  # the multimodal wrapper: its text model is gemma3_text
    assert family_types(["bert"]) is None  # config.json is untrusted: a list is no key
    assert family_types("gemma3_text").pooling == "mean"


def test_reading_model_folders_imports_no_torch():
    code = "import sys, embedfleet.shared.model_dir.load, embedfleet.shared.model_dir.families\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
