"""``embedfleet reindex`` and ``embedfleet jobs``: bulk jobs from the command line.

reindex reads documents (JSONL ``{"id", "text"}``, Parquet with id/text columns, or plain text with
one document a line), publishes them as job batches with JetStream's backpressure (each publish
waits for the stream's acknowledgement), collects the vectors from the results stream through a
durable consumer, and writes them in input order (.npy with a .ids.json beside it, or Parquet).
The job id is derived from the input and the model, so running the same command again after it was
killed resumes the job: published batches are not sent again, collected results are read again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np

from shared.config import ConfigError, NatsConfig
from shared.documents import job_id_for, read_documents
from shared.jobs import ensure_streams, stream_names, submit, update_state
from shared.lifecycle import connect
from shared.protocol import EmbedOptions, JobResult, ProtocolError, decode_as
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy


def write_output(out: Path, ids: list[str], vectors: np.ndarray) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() == ".parquet":
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError("writing Parquet needs pyarrow: pip install pyarrow, or write .npy") from None
        pq.write_table(pa.table({"id": ids, "vector": list(vectors)}), out)
    else:
        np.save(out, vectors)
        out.with_suffix(".ids.json").write_text(json.dumps(ids))


async def reindex(ns: argparse.Namespace, nats: NatsConfig) -> int:
    from tqdm import tqdm

    path, out = Path(ns.input), Path(ns.out)
    docs = read_documents(path)
    if not docs:
        raise ConfigError(f"{path} holds no documents")
    if len({d for d, _ in docs}) != len(docs):
        raise ConfigError(f"{path}: document ids must be unique")
    job = ns.job_id or job_id_for(path, ns.model, ns.batch_size)
    subjects = nats.subjects
    nc = await connect(nats, "embedfleet-reindex")
    js = nc.jetstream()
    kv = await ensure_streams(js, subjects)
    batches = (len(docs) + ns.batch_size - 1) // ns.batch_size
    print(f"job {job}: {len(docs)} documents in {batches} batches, model {ns.model}", flush=True)
    options = EmbedOptions(input_type=ns.input_type)
    publisher = asyncio.create_task(submit(js, kv, subjects, job, ns.model, docs, ns.batch_size, options, str(path)))
    # a fresh consumer from the stream's start each run: results collected before a crash are read again
    psub = await js.pull_subscribe(
        subjects.results(job), stream=stream_names(subjects)["results"],
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.EXPLICIT, inactive_threshold=60.0),
    )
    got: dict[str, np.ndarray] = {}
    tokens, last_progress = 0, time.monotonic()
    bar = tqdm(total=len(docs), unit="doc", desc="reindex", disable=ns.quiet)
    start_time = time.monotonic()
    try:
        while len(got) < len(docs):
            try:
                msgs = await psub.fetch(64, timeout=1)
            except Exception:
                msgs = []
            for msg in msgs:
                try:
                    result = decode_as(msg.data, JobResult)
                except ProtocolError:
                    await msg.term()
                    continue
                fresh = 0
                for doc_id, row in zip(result.doc_ids, result.array()):
                    if doc_id not in got:
                        got[doc_id] = row
                        fresh += 1
                tokens += result.tokens if fresh else 0
                bar.update(fresh)
                await msg.ack()
                last_progress = time.monotonic()
            bar.set_postfix(tokens_s=f"{tokens / max(time.monotonic() - start_time, 1e-6):,.0f}")
            if publisher.done() and publisher.exception():
                raise publisher.exception()
            if time.monotonic() - last_progress > ns.stall_timeout:
                errors = (await update_state(kv, job, lambda s: None)).get("errors", [])
                await update_state(kv, job, lambda s: s.update(status="stalled"))
                bar.close()
                print(f"job {job}: no progress for {ns.stall_timeout:.0f}s, {len(got)}/{len(docs)} documents; "
                      f"errors: {errors or 'none'}")
                return 1
        bar.close()
        await publisher
        ids = [d for d, _ in docs]
        write_output(out, ids, np.stack([got[d] for d in ids]))
        elapsed = time.monotonic() - start_time
        await update_state(kv, job, lambda s: s.update(status="done", collected=len(docs)) or s.setdefault("finished", time.time()))
        print(f"job {job}: {len(docs)} documents, {tokens} tokens in {elapsed:.1f}s ({tokens / max(elapsed, 1e-6):,.0f} tokens/s) "
              f"-> {out}")
        return 0
    finally:
        publisher.cancel()
        await nc.drain()


async def list_jobs(nats: NatsConfig) -> int:
    nc = await connect(nats, "embedfleet-jobs")
    try:
        kv = await ensure_streams(nc.jetstream(), nats.subjects)
        try:
            keys = await kv.keys()
        except Exception:
            keys = []
        print(f"{'job':18} {'status':9} {'documents':>9} {'batches':>7} {'published':>9} {'errors':>6}  model")
        for key in sorted(keys):
            s = json.loads((await kv.get(key)).value)
            print(f"{key:18} {s.get('status', '?'):9} {s.get('documents', 0):>9} {s.get('batches', 0):>7} "
                  f"{s.get('published', 0):>9} {len(s.get('errors', [])):>6}  {s.get('model', '?')}")
        return 0
    finally:
        await nc.close()
