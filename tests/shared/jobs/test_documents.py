"""Documents read from files and folders, each checked; job ids derived from an input: the same file
(folder), model, batch size and form give the same id."""

from pathlib import Path

import pytest

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.jobs.documents import job_id_for, read_documents, read_fields, read_input
from embedfleet.shared.vectors.forms import FORMS


def test_job_id_differs_by_form_and_not_otherwise(tmp_path: Path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "text": "one"}\n')
    ids = {form: job_id_for(docs, "m", 64, form) for form in FORMS}
    assert len(set(ids.values())) == len(FORMS)  # another form is another job
    assert ids == {form: job_id_for(docs, "m", 64, form) for form in FORMS}  # a rerun finds its job again
    assert job_id_for(docs, "m", 64) == ids["float32"]  # the default form
    assert job_id_for(docs, "m", 32, "int8") != ids["int8"] and job_id_for(docs, "other", 64, "int8") != ids["int8"]


def test_job_id_differs_by_output_and_chunking(tmp_path: Path):
    from embedfleet.shared.text_chunks import ChunkSpec, JobChunking

    docs = tmp_path / "docs.txt"
    docs.write_text("one\n")
    ids = {output: job_id_for(docs, "m", 64, "float32", output) for output in ("dense", "sparse", "multivector")}
    assert len(set(ids.values())) == 3 and job_id_for(docs, "m", 64) == ids["dense"]
    chunked = job_id_for(docs, "m", 64, chunking=JobChunking(ChunkSpec(8, 2)))
    assert chunked not in ids.values()
    assert chunked == job_id_for(docs, "m", 64, chunking=JobChunking(ChunkSpec(8, 2)))
    assert job_id_for(docs, "m", 64, chunking=JobChunking(ChunkSpec(8, 2), late=True)) != chunked


# -- every document checked when the file is read -----------------------------------------


def test_jsonl_and_text_are_read_in_order(tmp_path: Path):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"id": "a", "text": "one"}\n\n{"id": 7, "text": ""}\n')
    assert read_documents(jsonl) == [("a", "one"), ("7", "")]
    text = tmp_path / "d.txt"
    text.write_text("first\n\nthird\n")
    assert read_documents(text) == [("0", "first"), ("2", "third")]


@pytest.mark.parametrize(
    "lines, fragment",
    [
        (['{"id": "a", "text": "one"}', '{"id": "b", "text": 5}'], 'd.jsonl:2: "text" must be a string, not a number'),
        (['{"id": "a", "text": null}'], 'd.jsonl:1: "text" must be a string, not null'),
        (['{"id": true, "text": "x"}'], 'd.jsonl:1: "id" must be a string or an integer, not a boolean'),
        (['{"id": 1.5, "text": "x"}'], 'd.jsonl:1: "id" must be a string or an integer, not a number'),
        (['{"id": "a", "text": "one"}', '{"id": "a"'], "d.jsonl:2: not JSON"),
        (['["a", "one"]'], 'd.jsonl:1: each line must be a JSON object with "id" and "text"'),
        (['{"id": "a"}'], 'd.jsonl:1: each line must be a JSON object with "id" and "text"'),
        (
            ['{"id": "a", "text": "one"}', '{"id": "b", "text": "two"}', '{"id": "a", "text": "three"}'],
            "document id 'a' appears more than once",
        ),
        (['{"id": 1, "text": "one"}', '{"id": "1", "text": "two"}'], "document id '1' appears more than once"),
        ([""], "holds no documents"),
    ],
)
def test_a_malformed_jsonl_file_is_refused_at_its_first_problem(tmp_path: Path, lines, fragment):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as exc:
        read_documents(path)
    assert fragment in str(exc.value)


def test_a_file_that_is_not_utf8_or_not_there_is_refused(tmp_path: Path):
    path = tmp_path / "d.txt"
    path.write_bytes(b"caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        read_documents(path)
    with pytest.raises(ConfigError, match="is not a file"):
        read_documents(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="is not a file"):
        read_documents(tmp_path)


def test_parquet_documents(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": [3, 1, 2], "text": ["c", "a", "b"], "extra": [0, 0, 0]}), path)
    assert read_documents(path) == [("3", "c"), ("1", "a"), ("2", "b")]


@pytest.mark.parametrize(
    "columns, fragment",
    [
        ({"id": ["a", "b"], "body": ["x", "y"]}, "no column text (columns: id, body)"),
        ({"id": ["a", "b"], "text": [1, 2]}, "column text must hold strings, not int64"),
        ({"id": [1.5, 2.5], "text": ["x", "y"]}, "column id must hold strings or integers, not double"),
        ({"id": ["a", "b"], "text": ["x", None]}, "row 1 (counting from 0): text is null"),
        ({"id": ["a", None], "text": ["x", "y"]}, "row 1 (counting from 0): id is null"),
        ({"id": ["a", "a"], "text": ["x", "y"]}, "document id 'a' appears more than once"),
    ],
)
def test_a_malformed_parquet_file_is_refused(tmp_path: Path, columns, fragment):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.table(columns), path)
    with pytest.raises(ConfigError) as exc:
        read_documents(path)
    assert fragment in str(exc.value)


def test_a_parquet_name_on_another_file_is_refused(tmp_path: Path):
    path = tmp_path / "d.parquet"
    path.write_text('{"id": "a", "text": "one"}\n')
    with pytest.raises(ConfigError, match="not a Parquet file"):
        read_documents(path)


def test_a_documents_other_fields_are_its_metadata(tmp_path):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"id": 1, "text": "a", "lang": "de", "tags": ["x"]}\n{"id": "b", "text": "b"}\n')
    assert read_fields(jsonl) == {"1": {"lang": "de", "tags": ["x"]}, "b": {}}
    plain = tmp_path / "d.jsonl"
    plain.write_text('{"id": 1, "text": "a"}\n')
    assert read_fields(plain) is None  # nothing but id and text: no metadata
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": [1, 2], "text": ["a", "b"], "year": [2020, None]}), tmp_path / "d.parquet")
    assert read_fields(tmp_path / "d.parquet") == {"1": {"year": 2020}, "2": {"year": None}}
    assert read_fields(tmp_path / "d.txt") is None


# -- a folder: its text files, one document a file ---------------------------------------------


def _notes(root: Path) -> Path:
    (root / "notes" / "sub" / "deeper").mkdir(parents=True)
    (root / "notes" / "b.txt").write_text("bee\n")
    (root / "notes" / "a.md").write_text("# A\n\nfirst\n")
    (root / "notes" / "sub" / "c.TXT").write_text("see")
    (root / "notes" / "sub" / "deeper" / "d.md").write_text("")
    (root / "notes" / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\xff")  # not a document: never read
    (root / "notes" / "sub" / "notes.jsonl").write_text('{"id": 1, "text": "x"}\n')
    return root / "notes"


def test_a_folder_is_its_text_files_by_relative_path_in_order(tmp_path: Path):
    folder = _notes(tmp_path)
    assert read_input(folder) == [
        ("a.md", "# A\n\nfirst\n"),
        ("b.txt", "bee\n"),
        ("sub/c.TXT", "see"),
        ("sub/deeper/d.md", ""),
    ]
    assert read_fields(folder) is None  # no metadata besides the id
    assert read_input(folder / "b.txt") == [("0", "bee")]  # a file is read as before
    with pytest.raises(ConfigError, match="is not a file"):
        read_documents(folder)  # the gateway's path jobs take files only


def test_a_folder_without_documents_or_with_a_file_not_utf8_is_refused_naming_it(tmp_path: Path):
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    (empty / "sub" / "data.csv").write_text("a,b\n")
    with pytest.raises(ConfigError) as exc:
        read_input(empty)
    assert str(exc.value) == (
        f"{empty} holds no documents: no .txt or .md file under it (nor an image: .png, .jpg, .jpeg, .webp, .gif)"
    )
    folder = _notes(tmp_path)
    (folder / "sub" / "latin1.md").write_bytes(b"caf\xe9\n")
    with pytest.raises(ConfigError) as exc:
        read_input(folder)
    assert str(exc.value).startswith(
        f"{folder / 'sub' / 'latin1.md'}: not UTF-8 text (byte 3: invalid continuation byte)"
    )
    with pytest.raises(ConfigError, match="no such file or folder"):
        read_input(tmp_path / "missing")


def test_a_folders_job_id_is_stable_and_follows_its_documents(tmp_path: Path):
    import os

    folder = _notes(tmp_path)
    first = job_id_for(folder, "m", 64)
    os.utime(folder / "b.txt", ns=(1, 1))  # touched, not changed: the same job
    (folder / "skipped.csv").write_text("not a document")
    assert job_id_for(folder, "m", 64) == first
    assert job_id_for(folder, "m", 64, "int8") != first and job_id_for(folder, "other", 64) != first
    seen = {first}
    for change in (
        lambda: (folder / "b.txt").write_text("bee!\n"),  # a document edited
        lambda: (folder / "e.md").write_text("new"),  # one added
        lambda: (folder / "e.md").rename(folder / "f.md"),  # renamed: another id
        lambda: (folder / "sub" / "c.TXT").unlink(),
    ):  # removed
        change()
        now = job_id_for(folder, "m", 64)
        assert now not in seen
        seen.add(now)
    copy = tmp_path / "copy"
    copy.mkdir()
    for doc_id, text in read_input(folder):
        (copy / doc_id).parent.mkdir(parents=True, exist_ok=True)
        (copy / doc_id).write_text(text)
    assert job_id_for(copy, "m", 64) not in seen  # the same documents elsewhere: another job, as for files
