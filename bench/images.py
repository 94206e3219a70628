"""Images: what each stage costs, embedfleet's against transformers' on the same images, in one run.

    python -m bench.images                              # CLIP ViT-B/32's sizes, 64 images, 3 rounds
    python -m bench.images --family siglip --images 32
    python -m bench.images --shape tiny --images 8 --rounds 1 --out /tmp/images.json   # the code paths, quick
    python -m bench.images --family colqwen2 --shape pages --images 16 --batch 4   # ColQwen2's pages

Two stages, each timed side by side (the two alternate, ``--rounds`` each, medians):
- **prepare** (the tokenizer's work): image files (JPEG photos and PNG screenshots of several sizes,
  generated smooth so they compress as real ones do) to the pixels the model takes. embedfleet: decode and
  resize/crop to uint8 (services/tokenizer/images.py), the rescale and normalisation left to the worker;
  transformers: its image processor (the PIL backend) from the same files to normalised float32 pixels.
  Both decode with Pillow and resample identically (the pixels are compared: max abs difference).
- **forward** (the worker's work): those pixels through the image tower in batches of ``--batch``.
  embedfleet: the engine (uint8 pixels in, normalised on the device); transformers: ``get_image_features``
  on the processor's pixels. The vectors are compared (least cosine).
Each figure is images/s and CPU milliseconds an image (the process's CPU time over the images: every thread
counted), and the ratio embedfleet / transformers. Random weights at the model's real sizes (bench/two_towers.py).

ColQwen2 (``--family colqwen2``, bench/page_models.py; its ``pages`` shape: tiny widths, the published
processor's 4 to 768 image tokens a page): **prepare** is services/tokenizer/pages.py's (decode, resize, uint8
patch rows, the page prompt's ids) against ``ColQwen2Processor.process_images`` (normalised float32 patch rows
and ids); **forward** the engine's pages (uint8 in, a vector per token) against ``ColQwen2ForRetrieval`` on the
processor's batch. Pixels compared as the worker normalises them, vectors per token.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bench.page_models import make_colqwen2
from bench.two_towers import make_two_tower
from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.tokenizer.encoder import TextEncoder
from embedfleet.services.tokenizer.images import ImagePreparer
from embedfleet.services.tokenizer.pages import Page, PagePreparer, pack_pages
from embedfleet.shared.model_dir.load import load_model_info

# (width, height, format): photos as cameras and phones save them, and screenshots
SIZES = ((640, 480, "JPEG"), (1024, 768, "JPEG"), (480, 640, "JPEG"), (1280, 720, "PNG"), (300, 300, "PNG"))


def make_images(count: int, seed: int = 0, scale: float = 1.0) -> list[bytes]:
    """``count`` image files: smooth random fields (noise blurred, so they compress like photos)."""
    rng = np.random.default_rng(seed)
    files = []
    for i in range(count):
        w, h, kind = SIZES[i % len(SIZES)]
        w, h = max(8, int(w * scale)), max(8, int(h * scale))
        coarse = rng.integers(0, 256, (max(2, h // 32), max(2, w // 32), 3), dtype=np.uint8)
        image = Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC)
        out = io.BytesIO()
        image.save(out, kind, **({"quality": 90} if kind == "JPEG" else {}))
        files.append(out.getvalue())
    return files


def timed(work: Callable[[], object], items: int) -> dict[str, float]:
    """``work()`` once: images/s and CPU ms an image (process CPU time: all threads)."""
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"images_per_s": items / wall, "cpu_ms_per_image": 1000 * cpu / items}


def median_of(points: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(p[k] for p in points) for k in points[0]}


def run(family: str, shape: str, count: int, batch: int, rounds: int) -> dict:
    from transformers import AutoImageProcessor, AutoModel

    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        folder = make_two_tower(family, Path(tmp), shape)
        info = load_model_info(str(folder))
        preparer = ImagePreparer.for_model(info)
        assert preparer is not None  # a two-tower folder
        processor = AutoImageProcessor.from_pretrained(str(folder))
        model = AutoModel.from_pretrained(str(folder)).eval()
        engine = Engine(info, "cpu", "float32")
        files = make_images(count, scale=1.0 if shape != "tiny" else 0.1)

        def ours_prepare() -> np.ndarray:
            out = preparer.prepare(files)
            assert isinstance(out, np.ndarray), out
            return out

        def theirs_prepare() -> torch.Tensor:
            images = [Image.open(io.BytesIO(f)) for f in files]
            return processor(images=images, return_tensors="pt")["pixel_values"]

        pixels, reference = ours_prepare(), theirs_prepare()
        path = engine.image_path
        assert path is not None  # a two-tower folder's engine has its image path
        pixel_diff = float(np.abs(path.normalized(torch.from_numpy(pixels)).numpy() - reference.numpy()).max())

        def ours_forward() -> np.ndarray:
            return np.concatenate([engine.embed_images(pixels[i : i + batch]) for i in range(0, count, batch)])

        def theirs_forward() -> np.ndarray:
            with torch.inference_mode():
                parts = [
                    model.get_image_features(pixel_values=reference[i : i + batch]) for i in range(0, count, batch)
                ]
                return np.concatenate([p.pooler_output.numpy() for p in parts])

        a, b = ours_forward(), theirs_forward()
        cosine = float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
        stages = _stages(
            (("prepare", ours_prepare, theirs_prepare), ("forward", ours_forward, theirs_forward)), count, rounds
        )
        return {
            "family": family,
            "shape": shape,
            "images": count,
            "batch": batch,
            "rounds": rounds,
            "threads": torch.get_num_threads(),
            "max_abs_pixel_difference": pixel_diff,
            "least_cosine": cosine,
            "stages": stages,
        }


def run_pages(shape: str, count: int, batch: int, rounds: int) -> dict:
    """``run``'s two stages for ColQwen2's pages."""
    from transformers import ColQwen2ForRetrieval, ColQwen2Processor

    with tempfile.TemporaryDirectory(prefix="bench-pages-") as tmp:
        folder = make_colqwen2(Path(tmp), shape)
        info = load_model_info(str(folder))
        preparer = PagePreparer.for_model(info, TextEncoder(info))
        assert preparer is not None  # a page model
        processor = ColQwen2Processor.from_pretrained(str(folder))
        model = ColQwen2ForRetrieval.from_pretrained(str(folder)).eval()
        engine = Engine(info, "cpu", "float32")
        files = make_images(count, scale=1.0 if shape != "tiny" else 0.1)

        def ours_prepare() -> list[Page]:
            return [preparer.page(f) for f in files]

        def theirs_prepare() -> list:
            return [
                processor.process_images([Image.open(io.BytesIO(f)) for f in files[i : i + batch]])
                for i in range(0, count, batch)
            ]

        pages, reference = ours_prepare(), theirs_prepare()
        theirs_rows = np.concatenate(
            [
                b["pixel_values"][j, : int(b["image_grid_thw"][j, 1] * b["image_grid_thw"][j, 2])].numpy()
                for b in reference
                for j in range(len(b["pixel_values"]))
            ]
        )
        pixel_diff = float(
            np.abs(preparer.processing.pixel_values(np.concatenate([p.patches for p in pages])) - theirs_rows).max()
        )

        def ours_forward() -> list[np.ndarray]:
            out = []
            for i in range(0, count, batch):
                ids, cu, patches, grids = pack_pages(pages[i : i + batch])
                made = engine.step(ids, cu, outputs=("multivector",), pages=(patches, grids)).result()
                assert isinstance(made, dict)
                out += np.split(made["multivector"], cu[1:-1])
            return out

        def theirs_forward() -> list[np.ndarray]:
            out = []
            with torch.inference_mode():
                for inputs in reference:
                    made = model(**inputs).embeddings
                    mask = inputs["attention_mask"].bool()
                    out += [made[j][mask[j]].numpy() for j in range(len(made))]
            return out

        cosine = min(
            float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())
            for a, b in zip(ours_forward(), theirs_forward(), strict=True)
        )
        return {
            "family": "colqwen2",
            "shape": shape,
            "images": count,
            "batch": batch,
            "rounds": rounds,
            "threads": torch.get_num_threads(),
            "image_tokens": [int(len(p.patches) // 4) for p in pages],
            "max_abs_pixel_difference": pixel_diff,
            "least_cosine": cosine,
            "stages": _stages(
                (("prepare", ours_prepare, theirs_prepare), ("forward", ours_forward, theirs_forward)), count, rounds
            ),
        }


def _stages(pairs, count: int, rounds: int) -> dict:
    """Each stage's (ours, theirs) timed alternately ``rounds`` times: medians and ratios."""
    stages: dict = {}
    for stage, ours, theirs in pairs:
        mine, others = [], []
        for _ in range(rounds):  # alternating, so a busy moment costs both
            mine.append(timed(ours, count))
            others.append(timed(theirs, count))
        m, t = median_of(mine), median_of(others)
        stages[stage] = {
            "embedfleet": m,
            "transformers": t,
            "speed_ratio": m["images_per_s"] / t["images_per_s"],
            "cpu_ratio": m["cpu_ms_per_image"] / t["cpu_ms_per_image"],
        }
    return stages


def report(result: dict) -> str:
    lines = [
        (
            f"{result['family']} ({result['shape']}): {result['images']} images, batches of {result['batch']}, "
            f"{result['rounds']} rounds, {result['threads']} threads; pixels max abs diff "
            f"{result['max_abs_pixel_difference']:.2e}, vectors least cosine {result['least_cosine']:.6f}"
        ),
        (
            f"{'stage':8} {'embedfleet img/s':>17} {'transformers img/s':>19} {'speed':>7} "
            f"{'embedfleet CPU ms':>18} {'transformers CPU ms':>20} {'CPU':>6}"
        ),
    ]
    for stage, s in result["stages"].items():
        m, t = s["embedfleet"], s["transformers"]
        lines.append(
            f"{stage:8} {m['images_per_s']:>17,.1f} {t['images_per_s']:>19,.1f} {s['speed_ratio']:>6.2f}x "
            f"{m['cpu_ms_per_image']:>18.2f} {t['cpu_ms_per_image']:>20.2f} {s['cpu_ratio']:>5.2f}x"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=("clip", "siglip", "colqwen2"), default="clip")
    parser.add_argument("--shape", choices=("base", "tiny", "pages", "mid"), default="base")
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="write the figures as JSON here too")
    args = parser.parse_args()
    if (args.family == "colqwen2") != (args.shape in ("pages", "mid")) and args.shape != "tiny":
        parser.error(
            f"--shape {args.shape} is not one of {args.family}'s (clip, siglip: base, tiny; colqwen2: pages, mid, tiny)"
        )
    if args.family == "colqwen2":
        result = run_pages(args.shape, args.images, args.batch, args.rounds)
    else:
        result = run(args.family, args.shape, args.images, args.batch, args.rounds)
    print(report(result), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
