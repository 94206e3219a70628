"""A CLIP folder in the sentence-transformers packaging reads as the transformers folder it holds: as
published (modules.json naming one CLIPModel whose folder, 0_CLIPModel, holds config.json and the rest), and
as sentence-transformers saves it now (config.json at the root, the image processor in processor_config.json).
Nothing outside the packaging folder is followed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from tests.support.image_models import build_clip, package_clip


def _served(info) -> tuple:
    """What the stack serves of a folder, less where it lies and its name."""
    return (info.dim, info.pooling, info.inputs, info.image_tokens, info.max_seq_length, info.vocab_size)


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    return build_clip(tmp_path_factory.mktemp("clip"))


def test_the_published_packaging_reads_its_clip_folder(clip, tmp_path):
    packaged = package_clip(clip, tmp_path, "published")
    info = load_model_info(str(packaged))
    plain = load_model_info(str(clip))
    assert info.path == packaged / "0_CLIPModel"
    assert info.id == "published"  # the packaging folder's name, as the user named it
    assert _served(info) == _served(plain)


def test_the_saved_packaging_reads_its_processor_config(clip, tmp_path):
    packaged = package_clip(clip, tmp_path, "saved")
    assert not (packaged / "preprocessor_config.json").exists()
    info = load_model_info(str(packaged))
    plain = load_model_info(str(clip))
    assert info.path == packaged
    assert _served(info) == _served(plain)


def _modules(folder: Path, path: str, kind: str = "sentence_transformers.models.CLIPModel") -> None:
    (folder / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": path, "type": kind}]))


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("../outside", "sentence_transformers.models.CLIPModel"),  # a module folder outside the packaging
        ("0_CLIPModel", "sentence_transformers.models.Transformer"),  # not a CLIPModel
        ("missing", "sentence_transformers.models.CLIPModel"),  # no such folder
    ],
    ids=["outside", "not-clip", "missing"],
)
def test_a_root_without_config_json_is_refused_unless_its_one_module_is_a_clip_folder_inside(
    clip, tmp_path, path, kind
):
    root = tmp_path / "root"
    root.mkdir()
    shutil.copytree(clip, root / "0_CLIPModel")
    shutil.copytree(clip, tmp_path / "outside")
    _modules(root, path, kind)
    with pytest.raises(ConfigError, match=r"config\.json is missing"):
        load_model_info(str(root))


def test_pickled_weights_in_the_published_packaging_are_refused_with_the_command_that_converts_them(clip, tmp_path):
    """The hub's clip-ViT-B-32 may hold its weights as pytorch_model.bin: `embedfleet check` says so with the
    command that converts them once, and after running it as printed the folder serves."""
    import re
    import subprocess
    import sys

    import torch
    from safetensors.torch import load_file

    from embedfleet.services.cli.check import check_folder

    packaged = package_clip(clip, tmp_path, "published")
    inner = packaged / "0_CLIPModel"
    torch.save(load_file(inner / "model.safetensors"), inner / "pytorch_model.bin")
    (inner / "model.safetensors").unlink()
    report = check_folder(str(packaged))
    assert not report.ok and report.error is not None
    command = re.search(r'python -c "(.+)"$', report.error)
    assert command is not None, report.error
    subprocess.run([sys.executable, "-c", command.group(1)], check=True, timeout=120)
    assert check_folder(str(packaged)).ok, check_folder(str(packaged)).render()
