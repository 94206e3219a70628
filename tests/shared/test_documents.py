"""Job ids derived from an input file: the same file, model, batch size and form give the same id."""

from pathlib import Path

from shared.documents import job_id_for
from shared.quantize import FORMS


def test_job_id_differs_by_form_and_not_otherwise(tmp_path: Path):
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "text": "one"}\n')
    ids = {form: job_id_for(docs, "m", 64, form) for form in FORMS}
    assert len(set(ids.values())) == len(FORMS)  # another form is another job
    assert ids == {form: job_id_for(docs, "m", 64, form) for form in FORMS}  # a rerun finds its job again
    assert job_id_for(docs, "m", 64) == ids["float32"]  # the default form
    assert job_id_for(docs, "m", 32, "int8") != ids["int8"] and job_id_for(docs, "other", 64, "int8") != ids["int8"]


def test_float32_job_ids_are_those_made_before_forms_existed(tmp_path: Path):
    import hashlib

    docs = tmp_path / "docs.txt"
    docs.write_text("one\n")
    stat = docs.stat()
    before = hashlib.sha256(f"{docs.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|m|64".encode()).hexdigest()[:16]
    assert job_id_for(docs, "m", 64, "float32") == before  # a float job started by an older version still resumes
