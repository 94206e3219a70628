"""Images served over HTTP: embedfleet's stack against infinity-emb's server on the same CLIP folder, the
same images and the same client, alternating in one run.

    python -m bench.images_served --infinity PATH/infinity_emb [--images 64] [--seconds 10] [--concurrency 8]
    python -m bench.images_served --smoke     # embedfleet alone, the tiny shape, 1 s: the code path (the test)

The folder: random weights at CLIP ViT-B/32's sizes (bench/two_towers.py) with a tokenizer in CLIP's own
format, so that transformers' ``CLIPProcessor`` (what infinity-emb loads) reads it as embedfleet does.
The images: ``bench.images.make_images`` (JPEG photos and PNG screenshots of several sizes), sent as data
URIs in infinity-emb's form, ``{"model": ..., "input": [data URIs], "modality": "image"}`` to
``POST /v1/embeddings``, which embedfleet's gateway takes too: ``--per-request`` images a request,
``--concurrency`` requests in flight, for ``--seconds`` after a warm-up, ``--rounds`` times each.

Figures per system: images/s, p50/p99 per request, and CPU ms an image (user + system, /proc) of the whole
server: for embedfleet every process of ``embedfleet up`` (nats-server, gateway, tokenizer, worker, scorer,
up) and each apart, for infinity-emb its process tree; the client's (this process) apart. Both compute in
float32 on the CPU. The vectors are compared image by image (cosine), with each other and with transformers'
``CLIPModel.get_image_features`` in this process. Results: ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import orjson

from bench.e2e import infinity_server, load_summary
from bench.fabric_load import ROLES, infinity_pid, self_seconds, tree_seconds, up_stack
from bench.images import SIZES, make_images
from bench.two_towers import make_two_tower

AGREE = 0.999  # least cosine of an image's vectors from the two servers
Cpu = Callable[[], dict[str, float]]  # CPU seconds so far, by process
JSON = {"content-type": "application/json"}  # infinity-emb's FastAPI reads a body without it as text: 422


def clip_folder(root: Path, shape: str) -> Path:
    """``make_two_tower("clip", ...)`` with its tokenizer rewritten in CLIP's format (byte-level BPE whose
    words end in ``</w>``, a pre-tokenizer sequence): ``CLIPTokenizerFast``, which ``CLIPProcessor`` insists
    on, refuses a WordPiece tokenizer. One token a byte (no merges); ``<|startoftext|>`` and ``<|endoftext|>``
    at the config's bos and eos ids. Texts are not measured here: the folder need only load."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    folder = make_two_tower("clip", root, shape)
    text = json.loads((folder / "config.json").read_text())["text_config"]
    bos, eos = int(text["bos_token_id"]), int(text["eos_token_id"])
    chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = chars + [c + "</w>" for c in chars]
    for i, special in sorted({bos: "<|startoftext|>", eos: "<|endoftext|>"}.items()):
        tokens.insert(i, special)
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)},
        merges=[],
        unk_token="<|endoftext|>",
        continuing_subword_prefix="",
        end_of_word_suffix="</w>",
        fuse_unk=False,
    )
    tokenizer = Tokenizer(bpe)
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    words = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(words), "removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.RobertaProcessing(
        ("<|endoftext|>", eos), ("<|startoftext|>", bos), trim_offsets=False, add_prefix_space=False
    )
    tokenizer.add_special_tokens(["<|startoftext|>", "<|endoftext|>"])
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "CLIPTokenizer", "model_max_length": int(text["max_position_embeddings"])}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def data_uris(files: list[bytes]) -> list[str]:
    kinds = {b"\x89PNG": "png", b"\xff\xd8\xff": "jpeg"}
    return [
        f"data:image/{next(k for magic, k in kinds.items() if f.startswith(magic))};base64,"
        + base64.b64encode(f).decode()
        for f in files
    ]


def body(model: str, uris: list[str]) -> bytes:
    return orjson.dumps({"model": model, "input": uris, "modality": "image"})


async def drive(url: str, model: str, uris: list[str], per_request: int, in_flight: int, seconds: float) -> dict:
    """``in_flight`` clients, each sending requests of ``per_request`` images (taking turns through
    ``uris``) for ``seconds``; every request started is waited for and counted (an error status raises)."""
    import aiohttp

    bodies: dict[int, bytes] = {}  # by first image: built once, so the client costs little
    latencies: list[float] = []
    images = 0
    start = time.perf_counter()
    stop = start + seconds
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as client:

        async def one(k: int) -> None:
            nonlocal images
            i = k * per_request
            while time.perf_counter() < stop:
                first = i % len(uris)
                if first not in bodies:
                    bodies[first] = body(model, [uris[(first + j) % len(uris)] for j in range(per_request)])
                t = time.perf_counter()
                async with client.post(url, data=bodies[first], headers=JSON) as r:
                    await r.read()
                    r.raise_for_status()
                latencies.append(time.perf_counter() - t)
                images += per_request
                i += in_flight * per_request

        await asyncio.gather(*(one(k) for k in range(in_flight)))
    r = load_summary(latencies, images, time.perf_counter() - start)
    r.pop("latencies_ms")
    return {"images": r.pop("tokens"), "images_per_s": r.pop("tokens_per_s"), **r}


def vectors(url: str, model: str, uris: list[str], per_request: int) -> np.ndarray:
    """Each image's vector, ``per_request`` a request: [images, dim]."""
    import httpx

    rows = []
    for i in range(0, len(uris), per_request):
        r = httpx.post(url, content=body(model, uris[i : i + per_request]), headers=JSON, timeout=300)
        if r.status_code != 200:
            raise RuntimeError(f"{url} answered {r.status_code}: {r.text[:1000]}")
        rows += [d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])]
    return np.asarray(rows, dtype=np.float64)


def reference(folder: Path, files: list[bytes]) -> np.ndarray:
    """transformers in this process: ``CLIPProcessor`` and ``CLIPModel.get_image_features``."""
    import io

    import torch
    from PIL import Image
    from transformers import CLIPModel, CLIPProcessor

    processor = CLIPProcessor.from_pretrained(str(folder))
    model = CLIPModel.from_pretrained(str(folder)).eval()
    pixels = processor(images=[Image.open(io.BytesIO(f)) for f in files], return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        out = model.get_image_features(pixel_values=pixels)
    return np.asarray(getattr(out, "pooler_output", out), dtype=np.float64)


def least_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def window(url: str, model: str, uris: list[str], args: argparse.Namespace, cpu: Cpu, idle: Cpu) -> dict:
    """One measured window after a warm-up: rates, latencies, CPU ms an image by process ("server": all but
    the client), and the CPU the idle system beside it spent meanwhile (it shares the cores)."""
    asyncio.run(drive(url, model, uris, args.per_request, args.concurrency, args.warm_up))
    before, idle_before = cpu(), idle()
    result = asyncio.run(drive(url, model, uris, args.per_request, args.concurrency, args.seconds))
    after, idle_after = cpu(), idle()
    used = {p: after[p] - before[p] for p in after}
    n = max(result["images"], 1)
    per_image = {p: 1e3 * s / n for p, s in used.items()}
    per_image["server"] = sum(v for p, v in per_image.items() if p != "client")
    return {
        **result,
        "cpu_s": used,
        "cpu_ms_per_image": per_image,
        "idle_peer_cpu_s": idle_after["peer"] - idle_before["peer"],
    }


def median_of(windows: list[dict]) -> dict:
    keys = ("images_per_s", "requests_per_s", "p50_ms", "p99_ms")
    out = {k: statistics.median(w[k] for w in windows) for k in keys}
    out["cpu_ms_per_image"] = {
        p: statistics.median(w["cpu_ms_per_image"][p] for w in windows) for p in windows[0]["cpu_ms_per_image"]
    }
    return out


@contextmanager
def infinity(command: str, folder: Path, model: str) -> Iterator[tuple[str, Cpu]]:
    with infinity_server(command, "float32", folder=folder, name=model) as url:
        pid = infinity_pid(command)
        yield url, lambda: {"infinity-emb": tree_seconds(pid)}


def infinity_version(command: str) -> str:
    python = Path(command).parent / "python"
    done = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('infinity-emb'))"],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "unknown"


def run(args: argparse.Namespace) -> dict:
    files = make_images(args.images, scale=1.0 if args.shape == "base" else 0.1)
    uris = data_uris(files)
    environ = {"EMBEDFLEET_DTYPE": "float32", "EMBEDFLEET_MAX_BATCH_TOKENS": str(args.budget)}
    with tempfile.TemporaryDirectory(prefix="bench-images-served-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        folder = clip_folder(work, args.shape)
        expected = reference(folder, files)
        fleet = stack.enter_context(up_stack(folder, work / "data", work / "up.log", environ=environ))
        systems: dict[str, tuple[str, Cpu]] = {
            "embedfleet": (f"{fleet.base}/v1/embeddings", lambda: {**fleet.cpu(), "client": self_seconds()})
        }
        if args.infinity:
            url, server = stack.enter_context(infinity(args.infinity, folder, fleet.model))
            systems["infinity-emb"] = (url, lambda: {**server(), "client": self_seconds()})
        got = {name: vectors(url, fleet.model, uris, args.per_request) for name, (url, _) in systems.items()}
        agreement = {f"{name} / transformers": least_cosine(v, expected) for name, v in got.items()}
        if "infinity-emb" in got:
            agreement["embedfleet / infinity-emb"] = least_cosine(got["embedfleet"], got["infinity-emb"])
        windows: dict[str, list[dict]] = {name: [] for name in systems}
        for _ in range(args.rounds):  # alternating, so a busy moment costs both
            for name, (url, cpu) in systems.items():
                windows[name].append(window(url, fleet.model, uris, args, cpu, _beside(systems, name)))
                print(f"  {name:13} {_line(windows[name][-1])}", flush=True)
    result = {
        "shape": args.shape,
        "images": args.images,
        "sizes": [f"{w}x{h} {kind}" for w, h, kind in SIZES],
        "per_request": args.per_request,
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "budget": args.budget,
        "dtype": "float32",
        "cpus": os.cpu_count(),
        "cpu": _cpu_name(),
        "load_average_at_start": args.load_average,
        "infinity_emb": infinity_version(args.infinity) if args.infinity else None,
        "least_cosine": agreement,
        "systems": {name: {"median": median_of(ws), "windows": ws} for name, ws in windows.items()},
    }
    if args.infinity:
        ours, theirs = (result["systems"][s]["median"] for s in ("embedfleet", "infinity-emb"))
        result["ratios"] = {
            "images_per_s": ours["images_per_s"] / theirs["images_per_s"],
            "server_cpu_ms_per_image": ours["cpu_ms_per_image"]["server"] / theirs["cpu_ms_per_image"]["server"],
            "p50_ms": ours["p50_ms"] / theirs["p50_ms"],
            "p99_ms": ours["p99_ms"] / theirs["p99_ms"],
        }
    return result


def _beside(systems: dict[str, tuple[str, Cpu]], name: str) -> Cpu:
    """The other systems' server CPU seconds so far (the client's is the same process: left out)."""
    cpus = [cpu for other, (_, cpu) in systems.items() if other != name]
    return lambda: {"peer": sum(s for cpu in cpus for p, s in cpu().items() if p != "client")}


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def _line(w: dict) -> str:
    return (
        f"{w['images_per_s']:7.1f} img/s  p50 {w['p50_ms']:7.1f} ms  p99 {w['p99_ms']:7.1f} ms  "
        f"server CPU {w['cpu_ms_per_image']['server']:6.1f} ms/img  client {w['cpu_ms_per_image']['client']:5.1f}"
    )


def report(result: dict) -> str:
    lines = [
        (
            f"CLIP ({result['shape']}), {result['images']} images, {result['per_request']} a request, "
            f"{result['concurrency']} in flight, {result['seconds']} s x {result['rounds']} rounds, float32, "
            f"{result['cpus']} CPUs ({result['cpu']}), load {result['load_average_at_start']:.2f} at start"
        ),
        "least cosine: " + ", ".join(f"{k} {v:.6f}" for k, v in result["least_cosine"].items()),
        f"{'system':13} {'img/s':>7} {'p50 ms':>8} {'p99 ms':>8}  CPU ms an image: "
        + " ".join(f"{p:>11}" for p in ("server", *ROLES, "client")),
    ]
    for name, s in result["systems"].items():
        m = s["median"]
        cpu = m["cpu_ms_per_image"]
        lines.append(
            f"{name:13} {m['images_per_s']:7.1f} {m['p50_ms']:8.1f} {m['p99_ms']:8.1f}                  "
            + " ".join(f"{cpu[p]:11.2f}" if p in cpu else f"{'':>11}" for p in ("server", *ROLES, "client"))
        )
    if "ratios" in result:
        lines.append("embedfleet / infinity-emb: " + ", ".join(f"{k} {v:.2f}x" for k, v in result["ratios"].items()))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--infinity",
        default=os.environ.get("EMBEDFLEET_BENCH_INFINITY"),
        help="infinity_emb command (its own venv: make peer-infinity); without it infinity-emb is left out",
    )
    parser.add_argument("--images", type=int, default=64, help="distinct images the clients take turns through")
    parser.add_argument("--per-request", type=int, default=8, help="images a request (infinity-emb takes 32 at most)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds a window")
    parser.add_argument("--warm-up", type=float, default=2.0, help="unmeasured seconds before each window")
    parser.add_argument("--rounds", type=int, default=2, help="windows per system, alternating")
    parser.add_argument("--shape", choices=("base", "tiny"), default="base")
    parser.add_argument("--budget", type=int, default=2048, help="the worker's token budget (an image: 50 tokens)")
    parser.add_argument("--out", default="bench/results/images_served.json", help="JSON of the figures")
    parser.add_argument("--smoke", action="store_true", help="embedfleet alone, the tiny shape, 6 images, 1 s")
    args = parser.parse_args(argv)
    if args.smoke:
        args = argparse.Namespace(
            **{
                **vars(args),
                **dict(infinity=None, shape="tiny", images=6, per_request=3, concurrency=2),
                **dict(seconds=1.0, warm_up=0.3, rounds=1),
            }
        )
    if not 1 <= args.per_request <= 32:
        parser.error("--per-request must be 1 to 32 (infinity-emb's most images a request)")
    args.load_average = os.getloadavg()[0]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    print(report(result), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    if min(result["least_cosine"].values()) < AGREE:
        raise SystemExit(f"the vectors disagree: least cosine {result['least_cosine']} (< {AGREE})")


if __name__ == "__main__":
    main()
