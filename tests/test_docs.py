"""The README and docs/ speak of this repository only: no path or link that leads out of it, every
file or folder of it they name in backticks exists, every relative link leads to a file that exists,
and every anchor to a heading there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `shared/jobs/streams.py`, `deploy/k8s/`, `tests/integration/test_cluster.py`: a path under a top-level folder
_PATH = re.compile(r"`((?:shared|services|tests|bench|deploy|docs)/[\w./-]*)`")
# [text](target) and ![alt](target); a target with a scheme (https:, mailto:) or only an anchor is not a file
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def headings(text: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    anchors, fenced = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            anchors.add(re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-"))
    return anchors


def relative_links(text: str) -> list[str]:
    """The file part of every link in a page that names a file (anchors dropped), in page order."""
    targets = (m.group(1) for m in _LINK.finditer(text))
    return [t.split("#")[0] for t in targets if not _SCHEME.match(t) and not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_path_leads_out_of_the_repository(page):
    text = page.read_text()
    assert "../" not in text, [line for line in text.splitlines() if "../" in line][:3]
    assert "/work/" not in text
    away = [t for t in (m.group(1) for m in _LINK.finditer(text)) if _SCHEME.match(t)]
    assert not away, away


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_file_named_exists(page):
    named = set(_PATH.findall(page.read_text()))
    assert named, "the page names no file of the repository"
    missing = sorted(p for p in named if not (ROOT / p.split(":")[0].rstrip(".")).exists())
    assert not missing, missing


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file(page):
    links = relative_links(page.read_text())
    missing = sorted({t for t in links if not (page.parent / t).resolve().is_file()})
    assert not missing, missing
    outside = sorted({t for t in links if not (page.parent / t).resolve().is_relative_to(ROOT)})
    assert not outside, outside


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_anchor_names_a_heading(page):
    links = [m.group(1) for m in _LINK.finditer(page.read_text())]
    missing = []
    for target in (t for t in links if "#" in t and not _SCHEME.match(t)):
        file, anchor = target.split("#", 1)
        if anchor not in headings((page.parent / (file or page.name)).read_text()):
            missing.append(target)
    assert not missing, missing


def test_headings_give_github_anchors():
    text = (
        "# The `embedfleet` command\n## Bulk re-indexing (JetStream)\n"
        "```\n# a comment\n```\n### Limits, faults and errors"
    )
    assert headings(text) == {"the-embedfleet-command", "bulk-re-indexing-jetstream", "limits-faults-and-errors"}


def test_links_are_read_as_a_reader_follows_them():
    text = (
        "[a](docs/a.md) ![plot](bench/results/x.png) [b](b.md#part) [site](https://nats.io) "
        "[here](#quick-start) [mail](mailto:x@y)"
    )
    assert relative_links(text) == ["docs/a.md", "bench/results/x.png", "b.md"]


def test_a_missing_link_target_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[there](there.md) [here](page.md)")
    links = relative_links(page.read_text())
    assert [t for t in links if not (page.parent / t).is_file()] == ["there.md"]
