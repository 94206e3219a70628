"""The README and docs/ speak of this repository only: no path that leads out of it, and every file
or folder of it they name in backticks exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `shared/jobs.py`, `deploy/k8s/`, `tests/integration/test_cluster.py`: a path under a top-level folder
_PATH = re.compile(r"`((?:shared|services|tests|bench|deploy|docs)/[\w./-]*)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_path_leads_out_of_the_repository(page):
    text = page.read_text()
    assert "../" not in text, [line for line in text.splitlines() if "../" in line][:3]
    assert "/work/" not in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_file_named_exists(page):
    named = set(_PATH.findall(page.read_text()))
    assert named, "the page names no file of the repository"
    missing = sorted(p for p in named if not (ROOT / p.split(":")[0].rstrip(".")).exists())
    assert not missing, missing
