"""Documents for bulk jobs: reading them from files, and the job id a file gets."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from shared.config import ConfigError


def read_documents(path: Path) -> list[tuple[str, str]]:
    if not path.is_file():
        raise ConfigError(f"{path} is not a file")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        docs = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                docs.append((str(row["id"]), str(row["text"])))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ConfigError(f'{path}:{n}: each line must be a JSON object with "id" and "text"') from None
        return docs
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError("reading Parquet needs pyarrow: pip install pyarrow") from None
        table = pq.read_table(path, columns=["id", "text"])
        return [(str(i), str(t)) for i, t in zip(table["id"].to_pylist(), table["text"].to_pylist())]
    return [(str(n), line) for n, line in enumerate(path.read_text().splitlines()) if line.strip()]


def job_id_for(path: Path, model: str, batch_size: int, form: str = "float32", output: str = "dense") -> str:
    """The id of the job that embeds ``path`` with ``model`` into vectors of ``form``: the same file,
    model, batch size and form give the same id, so running a job again resumes it, and another form
    is another job. float32 leaves the key as it was before forms existed (those jobs still resume)."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{model}|{batch_size}"
    if form != "float32":
        key += f"|{form}"
    if output != "dense":  # sparse / multivector jobs
        key += f"|{output}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]
