"""The calibrated token budget kept in the data folder, a file per model, device and dtype.

A worker started again on the same machine serves with the budget measured the first time instead of
timing the device again: the same latency and throughput from one start to the next, and no seconds
of timing at each start. ``<data dir>/calibration/<model>-<device>-<dtype>-<key>.json`` holds the curve
it was picked from and when it was measured; delete it to measure again. The key is a hash of what the
curve depends on (``identity``): the model's config and weight files, the device (a CPU's model and
the threads the engine runs on), the dtype, the attention backend, CUDA graphs and the row cap.

Workers that start at once with the same key (the CPU replicas of one worker) take a lock on the file:
the first measures, the others wait and read what it found (their timings would disturb each other's).
A folder that cannot be written is a warning: the worker measures and serves, the next start measures again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import orjson
import torch

from embedfleet.services.gpu_worker.engine.calibrate import Calibration, Point, pick_knee
from embedfleet.services.gpu_worker.engine.engine import Engine

log = logging.getLogger("embedfleet.worker")

FOLDER = "calibration"  # under the data folder
_WEIGHTS = (".safetensors", ".bin")


@dataclass(frozen=True, slots=True)
class Cached:
    calibration: Calibration
    measured_at: str  # ISO 8601, UTC
    device: str
    path: Path


def identity(engine: Engine) -> dict[str, str]:
    """What an engine's curve depends on, by name (the cache file's key is made of it)."""
    return {
        "model": engine.info.id,
        "model_files": _model_digest(engine.info.path),
        "device": device_name(engine.device),
        "dtype": engine.dtype_name,
        "attention": engine.attention.name,
        "graphs": "on" if engine.graphs else "off",
        "max_batch_seqs": str(engine.max_batch_seqs),
    }


def device_name(device: torch.device) -> str:
    """ "cuda: NVIDIA H100 80GB HBM3", or "cpu: " a CPU's model name and the threads torch runs on here."""
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    threads = torch.get_num_threads()
    return f"cpu: {_cpu_model()}, {threads} thread{'s' if threads > 1 else ''}"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    import platform

    return platform.processor() or platform.machine() or "cpu"


def _model_digest(folder: Path) -> str:
    """A hash of the folder's config.json and its weight files' names and sizes (reading gigabytes of
    weights at each start to hash them would cost more than the calibration)."""
    digest = hashlib.sha256()
    with contextlib.suppress(OSError):
        digest.update((folder / "config.json").read_bytes())
    for path in sorted(p for p in folder.rglob("*") if p.suffix in _WEIGHTS and p.is_file()):
        digest.update(f"{path.relative_to(folder)}\0{path.stat().st_size}\0".encode())
    return digest.hexdigest()


class CalibrationCache:
    """The calibrations kept in ``folder`` (``<data dir>/calibration``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, key: dict[str, str]) -> Path:
        digest = hashlib.sha256(orjson.dumps(key, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{key['model']}-{key['device'].split(':')[0]}-{key['dtype']}")
        return self.folder / f"{name}-{digest}.json"

    @contextlib.contextmanager
    def lock(self, key: dict[str, str]) -> Iterator[None]:
        """Held while one process looks the key up and measures; none where the folder cannot be written."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path(key).with_suffix(".lock"), os.O_CREAT | os.O_RDWR, 0o644)
        except OSError:
            yield  # store() says why
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # and with it the lock

    def load(self, key: dict[str, str]) -> Cached | None:
        """The calibration kept for ``key``; None where there is none, or it cannot be read (said so)."""
        path = self.path(key)
        try:
            record = orjson.loads(path.read_bytes())
            if record["identity"] != key:
                return None  # another key's file under this name: measure, and replace it
            curve = tuple(Point(int(p["budget"]), tuple(float(r) for r in p["rates"])) for p in record["curve"])
            calibration = Calibration(curve, pick_knee(curve))
            return Cached(calibration, str(record["measured_at"]), key["device"], path)
        except (FileNotFoundError, NotADirectoryError):
            return None  # none kept (or no folder to keep it in: store() says so)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("calibration cached in %s not read (%s): measuring again", path, exc)
            return None

    def store(self, key: dict[str, str], calibration: Calibration) -> Path | None:
        """Keep ``calibration`` for ``key`` (atomically: a reader sees the whole file or none); its path,
        or None where the folder cannot be written (said so)."""
        path = self.path(key)
        record = {
            "identity": key,
            "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "knee": calibration.knee,
            "curve": [{"budget": p.budget, "rates": list(p.rates)} for p in calibration.curve],
        }
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".calibration-", suffix=".json")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(orjson.dumps(record, option=orjson.OPT_INDENT_2))
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            log.warning("calibration not kept in %s (%s): the next start measures again", self.folder, exc)
            return None
        return path
