"""reindex's output files: rows written in the job's form, as they came from the workers."""

import json

import numpy as np
import pytest

from shared.quantize import FORMS, quantize
from services.reindex import write_output


@pytest.mark.parametrize("form", list(FORMS))
def test_npy_keeps_the_forms_dtype_and_packed_width(tmp_path, form):
    stored = quantize(np.random.default_rng(0).standard_normal((4, 20)).astype(np.float32), form)
    out = tmp_path / "v.npy"
    write_output(out, ["a", "b", "c", "d"], stored, form, 20)
    back = np.load(out)
    assert back.dtype == FORMS[form][1] and back.shape == stored.shape and np.array_equal(back, stored)
    assert json.loads(out.with_suffix(".ids.json").read_text()) == ["a", "b", "c", "d"]


@pytest.mark.parametrize("form", ["int8", "binary", "float16"])
def test_parquet_holds_the_rows_and_names_the_form(tmp_path, form):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    stored = quantize(np.random.default_rng(0).standard_normal((3, 20)).astype(np.float32), form)
    out = tmp_path / "v.parquet"
    write_output(out, ["a", "b", "c"], stored, form, 20)
    table = pq.read_table(out)
    assert table.schema.metadata == {b"embedding_type": form.encode(), b"dim": b"20"}
    assert table["id"].to_pylist() == ["a", "b", "c"]
    assert table.schema.field("vector").type.value_type == pa.from_numpy_dtype(stored.dtype)  # int8, not int64
    assert np.array_equal(np.array(table["vector"].to_pylist(), stored.dtype), stored)
