"""Weights are read from safetensors only: a folder holding a torch pickle is refused with the command that
converts it once, and that command, as printed, makes a folder that loads."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from embedfleet.services.gpu_worker.engine.loader import read_safetensors
from embedfleet.shared.config.option import ConfigError


def test_a_pickled_checkpoint_is_refused_with_the_command_that_converts_it(tmp_path):
    weights = {"embeddings.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4), "bias": torch.ones(4)}
    torch.save(weights, tmp_path / "pytorch_model.bin")
    with pytest.raises(ConfigError, match="never pickles") as refused:
        read_safetensors(tmp_path)
    command = re.search(r'python -c "(.+)"$', str(refused.value))
    assert command is not None, refused.value
    subprocess.run([sys.executable, "-c", command.group(1)], check=True, timeout=120)
    loaded = read_safetensors(tmp_path)
    assert sorted(loaded) == sorted(weights)
    for name, tensor in weights.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0)


def test_a_folder_without_weights_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"has no \*\.safetensors weights") as refused:
        read_safetensors(tmp_path)
    assert "convert" not in str(refused.value)
