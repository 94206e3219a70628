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


def job_id_for(path: Path, model: str, batch_size: int) -> str:
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{model}|{batch_size}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]
