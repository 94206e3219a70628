"""kitoken against HF tokenizers on all-MiniLM-L6-v2: CPU per 1,000 tokens, and the code points they differ on.

    python -m bench.fast_tokenizer [--texts 2000] [--repeat 3]   # CPU (time.process_time: every thread)
    python -m bench.fast_tokenizer --reindex 1500 --model DIR    # the tokenizer process's CPU in a reindex
    python -m bench.fast_tokenizer --scan                        # rewrite services/tokenizer/fast_charset.py

The scan tokenizes every code point alone, between letters and doubled between words, both ways, and
writes the ranges where the two differ (about a minute): run it again when either library's version
changes, and the service's start-up check (``fast_check``) compares both on probes of those ranges.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tokenizers import Tokenizer

from bench.fleet import Observation, fleet
from bench.jobs import docs_file
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.services.tokenizer.fast_encoder import FastEncoder, load
from embedfleet.shared.model_dir.load import load_model_info
from tests.support.corpus import long_texts, mixed_texts

CHARSET = Path(__file__).resolve().parents[1] / "services" / "tokenizer" / "fast_charset.py"
_HEADER = '''"""Code points kitoken tokenizes differently from HF tokenizers (BERT uncased WordPiece), as ranges.

Written by ``python -m bench.fast_tokenizer --scan`` (kitoken {kit}, tokenizers {hf}): code points
unassigned in either library's Unicode tables (kitoken drops them, tokenizers keeps them as [UNK]),
those assigned since the older tables (other categories: dropped accents, split punctuation) and the
capital sigma (kitoken lowercases it to a final sigma at a word's end). Texts holding any go to tokenizers.
"""

DIVERGENT: tuple[tuple[int, int], ...] = (
'''


def _reference(info) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(info.path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def scan() -> list[tuple[int, int]]:
    """Ranges of the code points whose tokens differ, alone or in a word's context."""
    info = load_model_info(None)
    hf = _reference(info)
    fast = load(info.path / "tokenizer.json", hf, info.max_seq_length)
    points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]  # surrogates are no str content
    bad: set[int] = set()
    for context in ("{c}", "a{c}b", "x {c}{c} y"):
        for at in range(0, len(points), 20000):
            chunk = points[at : at + 20000]
            texts = [context.format(c=chr(c)) for c in chunk]
            mine = fast.content(texts)
            bad.update(
                c for c, a, b in zip(chunk, mine, hf.encode_batch(texts, add_special_tokens=False)) if a != b.ids
            )
    ranges: list[list[int]] = []
    for c in sorted(bad):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return [(a, b) for a, b in ranges]


def write_charset(ranges: list[tuple[int, int]]) -> None:
    import kitoken
    import tokenizers

    rows = [f"    (0x{a:04X}, 0x{b:04X})," for a, b in ranges]
    lines = [" ".join(r.strip() for r in rows[i : i + 6]) for i in range(0, len(rows), 6)]
    body = "".join(f"    {line}\n" for line in lines)
    version = getattr(kitoken, "__version__", None) or _dist_version("kitoken")
    CHARSET.write_text(_HEADER.format(kit=version, hf=tokenizers.__version__) + body + ")\n")


def _dist_version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


def _runs(
    hf: Tokenizer, encoder: TextEncoder, fast: FastEncoder, texts: list[str], truncate: bool
) -> dict[str, Callable[[], object]]:
    """The three ways to tokenize ``texts`` that are timed, by name."""
    return {
        "tokenizers encode_batch": lambda: hf.encode_batch(texts),
        "TextEncoder, tokenizers": lambda: encoder._encode_hf(texts, truncate, "right"),
        "TextEncoder, kitoken": lambda: fast.encode(
            texts, "right" if truncate else None, lambda r: encoder._encode_hf(r, truncate, "right")
        ),
    }


def cpu(texts: list[str], repeat: int) -> None:
    """CPU ms per 1,000 tokens: HF encode_batch, and TextEncoder's encode on each path; truncated at the
    model's limit (the tokens kept counted), then whole."""
    info = load_model_info(None)
    encoder = TextEncoder(info)
    fast = load(info.path / "tokenizer.json", _reference(info), info.max_seq_length)
    for truncate, mode in ((True, "right"), (False, "none")):
        hf = encoder._by_mode[mode]
        tokens = sum(len(e.ids) for e in hf.encode_batch(texts))
        runs = _runs(hf, encoder, fast, texts, truncate)
        print(f"{len(texts)} texts, {tokens} tokens ({f'truncated at {info.max_seq_length}' if truncate else 'whole'})")
        for name, run in runs.items():
            figures = []
            for _ in range(repeat):
                start = time.process_time()
                run()
                figures.append((time.process_time() - start) / tokens * 1e6)
            print(f"  {name:26s} " + "  ".join(f"{f:.3f}" for f in figures) + "  ms CPU / 1k tokens")


def reindex_cpu(documents: int, model: str | None) -> None:
    """The tokenizer process's CPU (from /proc) while ``embedfleet reindex`` embeds ``documents`` long
    texts, per 1,000 tokens kept, on each path; and HF encode_batch's on the same texts. A tiny model
    (``model``, a folder) keeps the worker quick: with a slow one the tokenizer's idle CPU counts too."""
    texts = long_texts(documents)
    info = load_model_info(model)
    hf = TextEncoder(info)._by_mode["right"]
    tokens = sum(len(e.ids) for e in hf.encode_batch(texts))
    start = time.process_time()
    hf.encode_batch(texts)
    print(
        f"{documents} documents, {tokens} tokens; tokenizers encode_batch "
        f"{(time.process_time() - start) / tokens * 1e6:.2f} ms CPU / 1k tokens"
    )
    served = ["--model", str(info.path)]
    for mode in ("off", "auto", "off", "auto"):
        watch = Observation(False)
        with (
            tempfile.TemporaryDirectory() as tmp,
            fleet([served], [*served, "--fast-tokenizer", mode], watch=watch) as (_, nats_url),
        ):
            tokenizer = watch.pids[0]
            docs = docs_file(Path(tmp), "long", texts)
            before = _cpu_seconds(tokenizer)
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "embedfleet.services.cli",
                    "reindex",
                    str(docs),
                    "--out",
                    f"{tmp}/out.npy",
                    "--nats",
                    nats_url,
                    "--model",
                    info.id,
                    "--quiet",
                ],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise SystemExit(proc.stdout + proc.stderr)
            print(
                f"  --fast-tokenizer {mode:4s}: the tokenizer process "
                f"{(_cpu_seconds(tokenizer) - before) / tokens * 1e6:.2f} ms CPU / 1k tokens",
                flush=True,
            )


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime, every thread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scan", action="store_true")
    parser.add_argument("--reindex", type=int, metavar="DOCUMENTS", help="measure the tokenizer process in a reindex")
    parser.add_argument("--model", help="the model folder of --reindex (default: all-MiniLM-L6-v2)")
    args = parser.parse_args()
    if args.scan:
        ranges = scan()
        write_charset(ranges)
        print(f"{len(ranges)} ranges, {sum(b - a + 1 for a, b in ranges)} code points -> {CHARSET}")
    elif args.reindex:
        reindex_cpu(args.reindex, args.model)
    else:
        cpu(mixed_texts(args.texts), args.repeat)


if __name__ == "__main__":
    main()
