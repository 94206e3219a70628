"""reindex's output files (also ``embedfleet jobs fetch``'s): checked before any work, then written
(a chunked job's: services/jobs/chunked_output.py)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from embedfleet.services.jobs.chunked_output import SIDECAR
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.vectors.forms import FORMS

# output kind -> the file suffixes it is written to
OUTPUT_SUFFIXES = {"dense": (".npy", ".parquet"), "sparse": (".npz",), "multivector": (".npz",)}
IDS, FAILED = ".ids.json", ".failed.json"  # beside the output: its rows' ids (.npy, .npz), the ids given up


def beside(out: Path, suffix: str) -> Path:
    """A file written beside the output: its name with the output's suffix replaced by ``suffix``
    (``--out v.npy``: ``v.ids.json``; ``--out fail.parquet``: ``fail.failed.json``)."""
    return out.with_suffix(suffix)


def write_output(out: Path, ids: list[str], vectors: np.ndarray, form: str = "float32", dim: int = 0) -> None:
    """``vectors``: [n, width(dim)] of the form's element type, written as they are (.npy:
    that dtype; Parquet: a list column of it, with the form and ``dim`` in the schema's metadata)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({"id": ids, "vector": list(vectors)})
        pq.write_table(
            table.replace_schema_metadata({"embedding_type": form, "dim": str(dim or vectors.shape[1])}), out
        )
    else:
        np.save(out, vectors)
        beside(out, IDS).write_text(json.dumps(ids))


def check_output_path(out: Path, output: str, chunked: bool = False) -> None:
    """Refuse, before any work, an output that could not be written: a format ``output`` is not
    written in, a folder in place of a file, a folder that cannot be made or written to. The folder is
    made here (as writing would make it). ``chunked``: a .npy gets a chunks sidecar too."""
    suffix = out.suffix.lower()
    if suffix not in OUTPUT_SUFFIXES[output]:
        if output == "dense":
            raise ConfigError(
                f"--out {out}: dense vectors are written to .npy (with .ids.json beside it) or .parquet, "
                f"not {out.suffix or 'a name without a suffix'}"
            )
        raise ConfigError(
            f"{output} vectors are written to .npz (a varying number of entries per document), not {out.suffix or out.name}"
        )
    for above in (out.parent, *out.parent.parents):
        if above.exists() and not above.is_dir():
            raise ConfigError(f"--out {out}: {above} is a file, not a folder")
    written = [out, beside(out, FAILED)] + ([] if suffix == ".parquet" else [beside(out, IDS)])
    written += [beside(out, SIDECAR)] if chunked and suffix != ".parquet" else []
    for path in written:
        if path.is_dir():
            raise ConfigError(f"--out {out}: {path} is a folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot make the folder {out.parent}: {exc.strerror or exc}") from None
    try:
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=".embedfleet-check-"):
            pass
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write in {out.parent}: {exc.strerror or exc}") from None
    for path in written:
        if path.exists() and not os.access(path, os.W_OK):
            raise ConfigError(f"--out {out}: {path} exists and cannot be written")


def write_ragged(out: Path, ids: list[str], items: list, output: str, form: str, dim: int) -> None:
    """Sparse vectors as scipy's CSR .npz (``scipy.sparse.load_npz`` reads it: data, indices, indptr,
    format, shape); multi-vectors as ``vectors`` [all tokens, width] with ``offsets`` [n + 1] (document
    i owns vectors[offsets[i]:offsets[i + 1]]). The ids in order go to .ids.json beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    counts = [len(item[0]) if output == "sparse" else len(item) for item in items]
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    dtype = FORMS[form].dtype
    if output == "sparse":
        indices = np.concatenate([i for i, _ in items]).astype(np.int32) if items else np.zeros(0, np.int32)
        values = np.concatenate([v for _, v in items]).astype(dtype) if items else np.zeros(0, dtype)
        np.savez(
            out,
            data=values,
            indices=indices,
            indptr=offsets,
            format=np.array(b"csr"),
            shape=np.array([len(items), dim], dtype=np.int64),
        )
    else:
        width = items[0].shape[1] if items else 0
        vectors = np.concatenate(items).astype(dtype, copy=False) if items else np.zeros((0, width), dtype)
        np.savez(
            out,
            vectors=vectors,
            offsets=offsets,
            dim=np.array(dim, dtype=np.int64),
            embedding_type=np.array(form.encode()),
        )
    beside(out, IDS).write_text(json.dumps(ids))
