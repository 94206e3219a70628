"""A bulk job's image documents read from folders, JSONL and Parquet (shared/jobs/documents.py and
image_docs.py): each one's size and header checked against the limits, named where it fails; paths
taken from the input's folder and held inside a root when given; files read again only as they were;
a job's id and request digest following its images' contents."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.images.decode import ImageLimits
from embedfleet.shared.jobs.documents import images_of, job_id_for, read_documents, read_fields, read_input, texts_of
from embedfleet.shared.jobs.image_docs import ImageChanged, ImageDoc
from embedfleet.shared.jobs.requests import request_digest
from embedfleet.shared.protocol import EmbedOptions
from tests.support.image_files import data_uri, encoded, huge_png_header, noise


def _png(side: int, seed: int = 0) -> bytes:
    return encoded(noise(side, side, np.random.default_rng(seed)))


def _images(docs) -> dict[str, bytes]:
    return {doc_id: image.read() for doc_id, image in docs}


def test_a_folder_of_images_is_a_job_of_images_by_relative_path(tmp_path: Path):
    folder = tmp_path / "pictures"
    (folder / "sub").mkdir(parents=True)
    files = {"b.png": _png(20, 1), "A.JPG": encoded(Image.new("RGB", (9, 7)), "JPEG"), "sub/c.webp": b""}
    files["sub/c.webp"] = encoded(Image.new("RGB", (5, 5)), "WEBP")
    files["sub/d.Gif"] = encoded(Image.new("RGB", (6, 6)), "GIF")
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "sub" / "data.csv").write_text("not a document\n")
    docs = read_input(folder)
    assert [d for d, _ in docs] == sorted(files) and _images(docs) == files
    assert images_of(docs) is not None and texts_of(docs) == [] and read_fields(folder) is None
    (folder / "sub" / "e.png").write_bytes(huge_png_header(50_000, 50_000))
    with pytest.raises(ConfigError, match=r"e\.png: the image is 50000x50000 = 2500000000 pixels, over the limit"):
        read_input(folder)
    (folder / "sub" / "e.png").write_bytes(b"not a picture")
    with pytest.raises(ConfigError, match=r"e\.png: the image is not a PNG, JPEG, WebP or GIF file"):
        read_input(folder)
    (folder / "notes.md").write_text("a text")  # a folder with texts is a job of its texts, as it always was
    assert read_input(folder) == [("notes.md", "a text")]


def test_a_jsonl_file_names_images_by_path_or_data_uri(tmp_path: Path):
    (tmp_path / "img").mkdir()
    first, second, third = _png(16, 1), _png(24, 2), _png(30, 3)
    (tmp_path / "img" / "1.png").write_bytes(first)
    (tmp_path / "img" / "2.png").write_bytes(second)
    lines = [
        {"id": "rel", "image": "img/1.png", "lang": "en"},
        {"id": 2, "image": str(tmp_path / "img" / "2.png")},
        {"id": "uri", "image": data_uri(third)},
    ]
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    docs = read_documents(path)
    assert _images(docs) == {"rel": first, "2": second, "uri": third}
    assert read_fields(path) == {"rel": {"lang": "en"}, "2": {}, "uri": {}}  # the image is no metadata
    held = [image for _, image in docs]
    assert held[0].path is not None and held[0].data is None and held[2].data == third  # files are read again


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ({"id": "a", "image": 7}, 'd.jsonl:2: "image" must be a string, not a number'),
        ({"id": "a", "image": "missing.png"}, "d.jsonl:2: document 'a': cannot read 'missing.png': No such file"),
        ({"id": "a", "image": "bomb.png"}, "d.jsonl:2: document 'a': the image is 50000x50000"),
        ({"id": "a", "image": "big.png"}, "d.jsonl:2: document 'a': the image is 5000 bytes, over the limit of 4000 bytes"),
        ({"id": "a", "image": "data:text/plain;base64,AAAA"}, "d.jsonl:2: document 'a': the data URI's media type"),
        ({"id": "a", "text": "x", "image": "ok.png"}, 'd.jsonl:2: each line must be a JSON object with "id" and "text" (or "image")'),
        ({"id": "a", "text": "a text"}, "d.jsonl:2: a text among documents that begin with an image: a job's documents are all texts or all images"),
    ],
    ids=["not-a-string", "missing", "bomb", "over-bytes", "not-an-image-uri", "both", "mixed"],
)  # fmt: skip
def test_a_bad_image_document_is_refused_naming_its_line(tmp_path: Path, line, says):
    (tmp_path / "ok.png").write_bytes(_png(10))
    (tmp_path / "bomb.png").write_bytes(huge_png_header(50_000, 50_000))
    (tmp_path / "big.png").write_bytes(_png(10).ljust(5000, b"\0"))  # a small picture in a file of 5,000 bytes
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"id": "ok", "image": "ok.png"}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(ConfigError) as caught:
        read_documents(path, ImageLimits(max_bytes=4000))
    assert str(caught.value).startswith(f"{tmp_path}/") and says in str(caught.value), caught.value


def test_images_inside_a_root_only(tmp_path: Path):
    """The gateway's path jobs: an image's path, relative or absolute or through a link, must name a file
    inside --jobs-dir; the message names it as the file wrote it."""
    root = tmp_path / "jobs"
    (root / "sub").mkdir(parents=True)
    outside = tmp_path / "secret.png"
    outside.write_bytes(_png(12))
    (root / "sub" / "in.png").write_bytes(_png(12))
    (root / "sub" / "link.png").symlink_to(outside)
    for image in ("../../secret.png", str(outside), "link.png"):
        path = root / "sub" / "d.jsonl"
        path.write_text(json.dumps({"id": "x", "image": image}) + "\n")
        with pytest.raises(ConfigError, match=f"document 'x': '{image}' is outside the jobs folder"):
            read_documents(path, root=root)
        assert images_of(read_documents(path)) is not None  # reindex: the user's own files, anywhere
    path.write_text(json.dumps({"id": "x", "image": "../sub/in.png"}) + "\n")
    assert _images(read_documents(path, root=root)) == {"x": (root / "sub" / "in.png").read_bytes()}


def test_parquet_images_as_bytes_or_paths(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = [_png(14, 1), _png(18, 2)]
    (tmp_path / "0.png").write_bytes(files[0])
    binary = tmp_path / "b.parquet"
    pq.write_table(pa.table({"id": [1, 2], "image": pa.array(files, pa.binary()), "n": [5, 6]}), binary)
    assert _images(read_documents(binary)) == {"1": files[0], "2": files[1]}
    assert read_fields(binary) == {"1": {"n": 5}, "2": {"n": 6}}
    paths = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "image": ["0.png", data_uri(files[1])]}), paths)
    assert _images(read_documents(paths)) == {"a": files[0], "b": files[1]}
    for columns, says in (
        ({"id": ["a"], "text": ["t"], "image": ["0.png"]}, "columns text and image"),
        ({"id": ["a"], "image": [3]}, "column image must hold binary (the files' bytes) or strings (their paths)"),
        ({"id": ["a", "b"], "image": pa.array([files[0], b"junk"], pa.binary())}, "row 1 (counting from 0): the image"),
    ):
        bad = tmp_path / "bad.parquet"
        pq.write_table(pa.table(columns), bad)
        with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
            read_documents(bad)


def test_an_image_file_changed_after_the_check_is_never_sent_as_another(tmp_path: Path):
    path = tmp_path / "a.png"
    path.write_bytes(_png(10, 1))
    ((_, image),) = read_input(path.parent)
    assert isinstance(image, ImageDoc) and image.read() == path.read_bytes()
    path.write_bytes(_png(10, 2))
    with pytest.raises(ImageChanged, match=r"image 'a\.png' changed since the job was submitted"):
        image.read()
    path.unlink()
    with pytest.raises(ImageChanged, match=r"image 'a\.png' cannot be read any more"):
        image.read()


def test_a_job_of_images_is_known_by_its_images(tmp_path: Path):
    folder = tmp_path / "pictures"
    folder.mkdir()
    (folder / "a.png").write_bytes(_png(10, 1))
    first = job_id_for(folder, "clip", 64)
    docs = read_input(folder)
    digest = request_digest("clip", docs, 64, EmbedOptions(), batch_bytes=1000)
    assert job_id_for(folder, "clip", 64, batch_bytes=1000) != first  # batches cut otherwise: another job
    assert request_digest("clip", docs, 64, EmbedOptions()) != digest
    (folder / "a.png").write_bytes(_png(10, 2))
    assert job_id_for(folder, "clip", 64) != first
    assert request_digest("clip", read_input(folder), 64, EmbedOptions(), batch_bytes=1000) != digest
    # a text job's digest is as it always was: its documents' texts, nothing of images
    assert request_digest("m", [("a", "x")], 8, EmbedOptions()) == request_digest("m", (("a", "x"),), 8, EmbedOptions())
