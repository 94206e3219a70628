"""ColQwen2 through the engine against transformers' ColQwen2ForRetrieval on the same inputs (CPU, float32): each
token's vector of queries (packed several to a batch, the reference one at a time) and of pages (the processor's
ids and patch rows, one image and two of different sizes to a batch), cosine >= 0.9999; image tokens and
patches that disagree are refused. And the folder read as ColQwen2Processor reads it: its prompts, the image
token's id, the image processor's patches against the vision tower's."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from bench.page_models import EMBEDDING_DIM, IMAGE_PAD
from embedfleet.services.gpu_worker.engine import Engine
from embedfleet.services.gpu_worker.engine.batch import DeviceBatch, Pages, prepare
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.load import load_model_info
from tests.conftest import cosines
from tests.support.page_models import build_colqwen2, reference, reference_vectors

QUERIES = ["what is the revenue in 2023?", "x", "a chart of rainfall by month, with the wettest months marked"]
SIZES = [(90, 150), (200, 120), (40, 41)]  # (height, width): 6x10, 14x8 and 4x4 patch grids
COSINE = 0.9999


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_colqwen2(tmp_path_factory.mktemp("colqwen2"))


@pytest.fixture(scope="module")
def hf(folder):
    return reference(folder)  # (model, processor)


@pytest.fixture(scope="module")
def engine(folder):
    return Engine(load_model_info(str(folder)), "cpu")


def _image(size: tuple[int, int], seed: int) -> Image.Image:
    """A noise image of (height, width)."""
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8))


def _page(processor, image: Image.Image) -> tuple[np.ndarray, torch.Tensor, tuple[int, int], object]:
    """The processor's ids [L], patch rows [gh * gw, 1176] and grid (gh, gw) of one page, and its inputs."""
    inputs = processor.process_images([image])
    t, gh, gw = inputs["image_grid_thw"][0].tolist()
    assert t == 1
    return inputs["input_ids"][0].numpy(), inputs["pixel_values"][0, : gh * gw], (gh, gw), inputs


def _run_pages(engine: Engine, rows: list[np.ndarray], patches: torch.Tensor, grids) -> np.ndarray:
    """Token vectors [T, dim] of a batch of page rows with their images, as the engine runs a batch with pages:
    the packed batch, its ``pages``, the model's forward, the multi-vector head."""
    cu = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
    host = prepare(np.concatenate(rows), cu, engine.spec.position_offset)
    batch = DeviceBatch(host, engine.device)
    batch.pages = Pages(patches=patches.to(engine.dtype), grids=tuple(grids))
    engine.attention.bind(host.cu_seqlens, batch.cu_seqlens, host.max_len, real_tokens=int(cu[-1]))
    with torch.inference_mode():
        hidden = engine.model(batch, engine.attention, engine.linear_ops)
        return engine.heads["multivector"](hidden[: int(cu[-1])]).numpy()


def test_a_colqwen2_folder_reads_as_a_page_model(folder, hf):
    _, processor = hf
    info = load_model_info(str(folder))
    assert (info.inputs, info.outputs, info.dim, info.normalize) == (("text", "image"), ("multivector",), 128, False)
    assert info.multivector is not None and info.multivector.checkpoint == "embedding_proj_layer"
    assert (info.multivector.dim, info.multivector.normalize) == (EMBEDDING_DIM, True)
    assert (info.hidden_size, info.vocab_size, info.max_seq_length) == (64, len(processor.tokenizer), 512)
    assert info.pages and info.image_token_id == IMAGE_PAD == processor.image_token_id
    assert (info.page_prompt, info.query_prefix) == (processor.visual_prompt_prefix, processor.query_prefix)
    assert info.query_suffix == processor.query_augmentation_token * 10 + "\n"
    assert (info.image_merge, info.image_tokens) == (processor.image_processor.merge_size, 0)


def test_the_processor_config_names_the_prompts_and_must_fit_the_tower(folder, tmp_path):
    """processor_config.json as ColQwen2Processor.save_pretrained writes it: its prompts win; an image processor
    that cuts other patches than the vision tower takes, or a page prompt without the image token, is refused."""
    copy = shutil.copytree(folder, tmp_path / "colqwen2")
    image_processor = json.loads((folder / "preprocessor_config.json").read_text())
    prompt = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Page.<|im_end|>"
    saved = {"image_processor": image_processor, "visual_prompt_prefix": prompt, "query_prefix": "Q: "}
    (copy / "processor_config.json").write_text(json.dumps(saved))
    info = load_model_info(str(copy))
    assert (info.page_prompt, info.query_prefix) == (prompt, "Q: ")
    (copy / "processor_config.json").write_text(json.dumps({**saved, "visual_prompt_prefix": "no image"}))
    with pytest.raises(ConfigError, match="must hold the image token '<\\|image_pad\\|>' once"):
        load_model_info(str(copy))
    (copy / "processor_config.json").write_text(
        json.dumps({**saved, "image_processor": {**image_processor, "merge_size": 1}})
    )
    with pytest.raises(ConfigError, match="merge_size 1 differs from the vision tower's spatial_merge_size 2"):
        load_model_info(str(copy))


def test_an_image_token_the_tokenizer_names_otherwise_is_refused(folder, tmp_path):
    copy = shutil.copytree(folder, tmp_path / "colqwen2")
    config = json.loads((copy / "config.json").read_text())
    config["vlm_config"]["image_token_id"] = IMAGE_PAD - 1
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConfigError, match=f"image_token_id is {IMAGE_PAD - 1}; the tokenizer's '<\\|image_pad\\|>' is {IMAGE_PAD}"
    ):
        load_model_info(str(copy))


def test_query_tokens_equal_colqwen2_for_retrieval(engine, hf):
    model, processor = hf
    rows = [processor.process_queries([q])["input_ids"][0].numpy() for q in QUERIES]
    info = engine.info
    ids = [  # the processor's ids are the query wrapped as ModelInfo says
        processor.tokenizer(info.query_prefix + q + info.query_suffix)["input_ids"] for q in QUERIES
    ]
    assert [list(r) for r in rows] == ids
    cu = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
    assert len({len(r) for r in rows}) == len(QUERIES)  # several lengths packed in one batch
    vectors = engine.step(np.concatenate(rows).astype(np.int32), cu, outputs=("multivector",)).result()["multivector"]
    assert vectors.shape == (cu[-1], EMBEDDING_DIM)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    for i, query in enumerate(QUERIES):
        theirs = reference_vectors(model, processor.process_queries([query]))
        ours = vectors[cu[i] : cu[i + 1]]
        assert ours.shape == theirs.shape
        assert cosines(ours, theirs).min() >= COSINE, (query, cosines(ours, theirs))


@pytest.mark.parametrize("size", SIZES)
def test_page_tokens_equal_colqwen2_for_retrieval(engine, hf, size):
    model, processor = hf
    ids, patches, grid, inputs = _page(processor, _image(size, sum(size)))
    assert int((ids == IMAGE_PAD).sum()) == grid[0] * grid[1] // 4
    ours = _run_pages(engine, [ids], patches, [grid])
    theirs = reference_vectors(model, inputs)
    assert ours.shape == theirs.shape == (len(ids), EMBEDDING_DIM)
    assert cosines(ours, theirs).min() >= COSINE, cosines(ours, theirs)


def test_two_pages_of_different_sizes_in_one_batch(engine, hf):
    model, processor = hf
    pages = [_page(processor, _image(size, i)) for i, size in enumerate(SIZES[:2])]
    assert pages[0][2] != pages[1][2]
    ours = _run_pages(engine, [p[0] for p in pages], torch.cat([p[1] for p in pages]), [p[2] for p in pages])
    start = 0
    for ids, _, _, inputs in pages:
        theirs = reference_vectors(model, inputs)
        assert cosines(ours[start : start + len(ids)], theirs).min() >= COSINE
        start += len(ids)
    assert start == len(ours)


def test_image_tokens_and_patches_must_agree(engine, hf):
    _, processor = hf
    ids, patches, grid, _ = _page(processor, _image(SIZES[0], 0))
    fewer = np.delete(ids, int(np.argmax(ids == IMAGE_PAD)))  # one image token short
    with pytest.raises(ValueError, match="holds 14 image tokens; its images"):
        _run_pages(engine, [fewer], patches, [grid])
    with pytest.raises(ValueError, match="59 patch rows for images of 60 patches"):
        _run_pages(engine, [ids], patches[:-1], [grid])
    with pytest.raises(ValueError, match="not in whole 2x2 windows"):
        _run_pages(engine, [ids], patches, [(5, 12)])


def test_both_tensor_layouts_load_alike(folder, engine, tmp_path):
    """The published names (vlm.model.…) and transformers 5's (vlm.…) load the same weights."""
    other = Engine(load_model_info(str(build_colqwen2(tmp_path, hub_names=False))), "cpu")
    ids = np.array([5, 6, 7, 8], dtype=np.int32)
    cu = np.array([0, 4], dtype=np.int32)
    a, b = (e.step(ids, cu, outputs=("multivector",)).result()["multivector"] for e in (engine, other))
    np.testing.assert_array_equal(a, b)


def test_the_projection_comes_from_the_checkpoint(folder, tmp_path):
    """embedding_proj_layer is read from the model's own tensors: missing, or of another size than the config's
    embedding_dim, the folder is refused at start."""
    from safetensors.torch import load_file, save_file

    copy = shutil.copytree(folder, tmp_path / "colqwen2")
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "embedding_dim": 64}))
    with pytest.raises(ConfigError, match=r"embedding_proj_layer\.weight has shape \(128, 64\): expected \[64, 64\]"):
        Engine(load_model_info(str(copy)), "cpu")
    tensors = load_file(str(copy / "model.safetensors"))
    del tensors["embedding_proj_layer.weight"]
    save_file(tensors, str(copy / "model.safetensors"))
    with pytest.raises(ConfigError, match=r"checkpoint is missing tensor 'embedding_proj_layer\.weight'"):
        Engine(load_model_info(str(copy)), "cpu")


def test_the_engine_runs_pages_from_the_tokenizers_uint8_rows(engine, hf):
    """Engine.step with ``pages`` as the tokenizer sends them (uint8 patch rows, normalised on the device) gives
    the tokens transformers gives, beside a query in the same batch (a batch may mix them)."""
    from embedfleet.services.tokenizer.encoder import TextEncoder
    from embedfleet.services.tokenizer.pages import PagePreparer
    from embedfleet.shared.images.pages import PageProcessing

    model, processor = hf
    preparer = PagePreparer.for_model(engine.info, TextEncoder(engine.info))
    assert preparer is not None
    image = _image(SIZES[1], 3)
    page = preparer.page(_png(image))
    ids, _, grid, inputs = _page(processor, image)
    np.testing.assert_array_equal(page.ids, ids)  # the page prompt expanded as ColQwen2Processor expands it
    assert page.grid == grid
    query = processor.process_queries([QUERIES[0]])["input_ids"][0].numpy()
    rows = [query.astype(np.int32), page.ids]
    cu = np.array([0, len(query), len(query) + len(page.ids)], np.int32)
    grids = np.array([grid], np.int32)
    engine.check_pages(np.concatenate(rows), cu, page.patches, grids)
    made = engine.step(np.concatenate(rows), cu, outputs=("multivector",), pages=(page.patches, grids)).result()
    assert isinstance(made, dict)
    ours = made["multivector"]
    assert cosines(ours[len(query) :], reference_vectors(model, inputs)).min() >= COSINE
    with torch.no_grad():
        theirs = model(**processor.process_queries([QUERIES[0]])).embeddings[0].numpy()
    assert cosines(ours[: len(query)], theirs).min() >= COSINE
    assert PageProcessing.from_folder(engine.info.path).row_bytes == page.patches.shape[1]


def _png(image: Image.Image) -> bytes:
    import io

    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def test_check_pages_refuses_what_the_model_cannot_take(engine):
    """Forged or mismatched page rows are refused before they run, naming the row at fault."""
    from embedfleet.services.gpu_worker.engine.errors import InvalidTokens

    grid = np.array([[4, 4]], np.int32)  # 16 patches: 4 image tokens
    ids = np.array([5, IMAGE_PAD, IMAGE_PAD, IMAGE_PAD, IMAGE_PAD, 6], np.int32)
    cu = np.array([0, len(ids)], np.int32)
    patches = np.zeros((16, engine.page_processing.row_bytes), np.uint8)
    engine.check_pages(ids, cu, patches, grid)  # as it should be
    two = np.array([0, 2, len(ids)], np.int32)
    cases = [
        ((ids, cu, None, None), "is one of 1 rows with image tokens for 0 images"),
        ((ids[:-2], np.array([0, 4], np.int32), patches, grid), "has 3 image tokens for a 4x4-patch image"),
        ((ids, cu, patches[:, :-1], grid), "587-byte patches"),
        ((ids, cu, np.zeros((15, 588), np.uint8), np.array([[3, 5]], np.int32)), "for a 3x5-patch image"),
        ((ids, cu, patches[:-1], grid), "15 patch rows for images of 16 patches"),
        ((ids, cu, patches, np.zeros((0, 2), np.int32)), "1 rows with image tokens for 0 images"),
        ((ids, two, patches, np.array([[2, 2], [2, 2]], np.int32)), "row 1 has 3 image tokens for a 2x2-patch image"),
    ]
    for args, says in cases:
        with pytest.raises(InvalidTokens, match=says):
            engine.check_pages(*args)
    huge = engine.page_processing.max_patches + 4
    with pytest.raises(InvalidTokens, match="image"):
        engine.check_pages(ids, cu, np.zeros((huge * 2, 588), np.uint8), np.array([[2, huge]], np.int32))


def test_the_default_precision_is_the_checkpoints_half_on_a_gpu_and_float32_on_cpu():
    from embedfleet.services.gpu_worker.engine.engine import default_dtype

    assert default_dtype("cuda", {"torch_dtype": "bfloat16"}) == "bfloat16"  # ColQwen2, Qwen3, Gemma as published
    assert default_dtype("cuda", {"dtype": "bfloat16"}) == "bfloat16"  # transformers 5 saves "dtype"
    assert default_dtype("cuda", {"torch_dtype": "float32"}) == default_dtype("cuda", {}) == "float16"
    assert default_dtype("cpu", {"torch_dtype": "bfloat16"}) == "float32"
