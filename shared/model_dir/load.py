"""A model folder read into its ``ModelInfo``: which kind of folder it is (a dense embedder, a SPLADE
or multi-vector encoder, a classifier or an LLM reranker), its real sequence limit, its prompts."""

from __future__ import annotations

from typing import Any

from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.images.naflex import NaFlexProcessing
from embedfleet.shared.images.preprocess import processor_config
from embedfleet.shared.model_dir.families import (
    PAGE_MODELS,
    QWEN2_VL_IMAGE_TOKEN_ID,
    SIGLIP,
    TWO_TOWERS,
    family_types,
    position_offset,
    vlm_text_config,
    vlm_vision_config,
)
from embedfleet.shared.model_dir.folder import ModelFolder, read_folder, read_json, setting
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.model_dir.outputs import (
    MultiVectorSpec,
    bge_m3_heads,
    is_multi_vector_encoder,
    is_sparse_encoder,
    multi_vector,
    splade,
)
from embedfleet.shared.model_dir.scoring import (
    classifier_labels,
    is_classifier,
    label_names,
    logit_score_tokens,
    pair_template,
    score_activation,
)
from embedfleet.shared.model_dir.stack import check_dense_chain, pooling_mode, read_dense, read_stack


def load_model_info(model: str | None, model_id: str | None = None) -> ModelInfo:
    """Read a model folder's configs; ``model`` None means the default shipped model."""
    folder, default_id = read_folder(model)
    config = folder.config
    pages = family_types(config.get("model_type")) in PAGE_MODELS
    # the config holding the language model's sizes: a page model keeps them nested under vlm_config
    text = vlm_text_config(config) if pages else config
    common: dict[str, Any] = dict(
        id=model_id or default_id, path=folder.path, max_seq_length=_max_seq_length(folder, text)
    )
    if score_tokens := logit_score_tokens(folder):
        return _llm_reranker(folder, score_tokens, common)
    if is_classifier(config):
        labels = classifier_labels(config)
        return ModelInfo(
            dim=labels,
            pooling="cls",
            normalize=False,
            vocab_size=int(config["vocab_size"]),
            prompts={},
            task="score",
            labels=label_names(config, labels),
            **common,
        )
    prompts = _prompts(folder)
    common.update(
        adapters=task_adapters(config),
        vocab_size=int(setting(text, "vocab_size")),
        prompts=prompts,
        default_prompt=_default_prompt(folder, prompts),
        hidden_size=int(setting(text, "hidden_size")),
    )
    if pages:
        return _page_model(folder, common)
    if is_sparse_encoder(folder):
        sparse = splade(folder)
        return ModelInfo(
            dim=common["vocab_size"], pooling="max", normalize=False, outputs=("sparse",), sparse=sparse, **common
        )
    if family_types(config.get("model_type")) in TWO_TOWERS:
        return _two_towers(folder, common)
    if is_multi_vector_encoder(folder):
        spec = multi_vector(folder, common["hidden_size"])
        return ModelInfo(
            dim=spec.dim, pooling="cls", normalize=False, outputs=("multivector",), multivector=spec, **common
        )
    return _dense_encoder(folder, common)


def _max_seq_length(folder: ModelFolder, text: dict[str, Any]) -> int:
    """The longest input, special tokens included: the configured limit, capped by the positions
    (``text``: the config holding the language model's sizes, config.json's own but for a page model)."""
    max_positions = int(setting(text, "max_position_embeddings", 512)) - position_offset(folder.config)
    # tokenizer_config's model_max_length may be a huge sentinel (1e30): the min below caps it
    limit = folder.st_config.get("max_seq_length") or folder.tok_config.get("model_max_length") or max_positions
    return min(int(limit), max_positions)


def _dense_encoder(folder: ModelFolder, common: dict[str, Any]) -> ModelInfo:
    """A sentence-transformers embedder: Transformer -> Pooling -> Dense* -> Normalize? (and BGE-M3's
    sparse and multi-vector heads beside the dense one)."""
    stack = read_stack(folder)
    pooling_config = read_json(stack.pooling / "config.json") if stack.pooling else {}
    # "embedding_dimension" since sentence-transformers 6, "word_embedding_dimension" before
    pooled_dim = int(
        pooling_config.get("embedding_dimension")
        or pooling_config.get("word_embedding_dimension")
        or setting(folder.config, "hidden_size")
    )
    dense = tuple(read_dense(d) for d in stack.dense)
    check_dense_chain(dense, pooled_dim)
    sparse, multivector = bge_m3_heads(folder)
    return ModelInfo(
        dim=dense[-1].out_features if dense else pooled_dim,
        pooling=pooling_mode(pooling_config, folder.config, stack.pooling),
        normalize=stack.normalize,
        include_prompt=bool(pooling_config.get("include_prompt", True)),
        dense=dense,
        truncate_dim=_truncate_dim(folder),
        outputs=("dense",) + (("sparse",) if sparse else ()) + (("multivector",) if multivector else ()),
        sparse=sparse,
        multivector=multivector,
        **common,
    )


def _two_towers(folder: ModelFolder, common: dict[str, Any]) -> ModelInfo:
    """A text tower and an image tower projected into one space (CLIP): texts pooled as the family pools
    them, images by the image tower, both ``projection_dim`` wide and, as the model gives them, not
    normalised (clients compare them by cosine)."""
    processor_config(folder.path)  # how its images are prepared: refused here when the folder does not say
    family = family_types(folder.config.get("model_type"))
    assert family is not None and family.pooling is not None  # TWO_TOWERS families pool as they declare
    text, vision = folder.config.get("text_config") or {}, folder.config.get("vision_config") or {}
    siglip = family is SIGLIP
    # the configs' class defaults (CLIP ViT-B/32, SigLIP base/16) for what a saved config leaves out
    size, patch = int(vision.get("image_size", 224)), int(vision.get("patch_size", 16 if siglip else 32))
    naflex = folder.config.get("model_type") == "siglip2"  # each image at its own grid, at most max_num_patches
    if naflex:
        processing = NaFlexProcessing.from_folder(folder.path)
        if processing.patch_size != patch:
            raise ConfigError(
                f"the image processor's patch_size {processing.patch_size} is not vision_config's {patch}"
            )
        patches = processing.max_num_patches
    elif size % patch:
        raise ConfigError(f"config.json: vision_config's image_size {size} is not a multiple of its patch_size {patch}")
    else:
        patches = (size // patch) ** 2
    if siglip:  # no class token; texts padded to the tower's positions, as its processor pads them
        dim = int(text.get("projection_size") or text.get("hidden_size", 768))
        padding = {"pad_to": common["max_seq_length"], "pad_id": int(text.get("pad_token_id", 1))}
        return ModelInfo(
            dim=dim,
            pooling=family.pooling,
            normalize=False,
            inputs=("text", "image"),
            image_tokens=patches,
            patch_images=naflex,
            **padding,
            **common,
        )
    return ModelInfo(
        dim=int(folder.config.get("projection_dim", 512)),
        pooling=family.pooling,
        normalize=False,
        inputs=("text", "image"),
        image_tokens=patches + 1,
        **common,
    )


# ColQwen2Processor's defaults: the text a page's image tokens are put in, and a query's prefix
PAGE_PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|><|endoftext|>"
QUERY_PREFIX = "Query: "
IMAGE_TOKEN = "<|image_pad|>"  # ColQwen2Processor's image token, unless the tokenizer names another
QUERY_AUGMENTATION = 10  # pad tokens after a query's text (ColQwen2Processor.query_augmentation_token * 10)
_PROCESSOR_DEFAULTS = {"merge_size": 2, "patch_size": 14, "temporal_patch_size": 2}  # Qwen2VLImageProcessor's


def _page_model(folder: ModelFolder, common: dict[str, Any]) -> ModelInfo:
    """A page model (ColQwen2, as transformers' ColQwen2ForRetrieval and ColQwen2Processor run it): a
    query is ``query_prefix + text + pad * 10 + "\\n"``, a page the processor's ``visual_prompt_prefix``
    with its image token expanded to the image's tokens; every token's final state projected by the
    checkpoint's ``embedding_proj_layer`` to ``embedding_dim`` and L2-normalised."""
    from embedfleet.shared.images.preprocess import processor_config  # numpy: only a page model's reader needs it

    config = folder.config
    vlm, vision = config.get("vlm_config") or {}, vlm_vision_config(config)
    image_config, where = processor_config(folder.path)
    # the image processor cuts the patches and counts the image tokens; the vision tower reads them so
    pairs = (("merge_size", "spatial_merge_size"), ("patch_size", "patch_size"), ("temporal_patch_size",) * 2)
    for key, ours in pairs:
        theirs = int(image_config.get(key, _PROCESSOR_DEFAULTS[key]))
        if theirs != int(vision[ours]):
            raise ConfigError(f"{where}: {key} {theirs} differs from the vision tower's {ours} {vision[ours]}")
    merge = int(vision["spatial_merge_size"])
    processor = read_json(folder.path / "processor_config.json")
    processor = processor if isinstance(processor, dict) else {}
    prompt = str(processor.get("visual_prompt_prefix") or PAGE_PROMPT)
    extra = folder.tok_config.get("extra_special_tokens")
    named = folder.tok_config.get("image_token") or (extra.get("image_token") if isinstance(extra, dict) else None)
    image_token = _token_text(named) or IMAGE_TOKEN  # the tokenizer's image_token where it names one
    if prompt.count(image_token) != 1:
        raise ConfigError(f"the page prompt {prompt!r} must hold the image token {image_token!r} once")
    image_token_id = int(vlm.get("image_token_id", QWEN2_VL_IMAGE_TOKEN_ID))
    found = _token_id(folder, image_token)
    if found != image_token_id:
        raise ConfigError(
            f"config.json's image_token_id is {image_token_id}; the tokenizer's {image_token!r} is {found}"
        )
    specials = read_json(folder.path / "special_tokens_map.json")  # older tokenizers' special tokens
    pad = _token_text(folder.tok_config.get("pad_token")) or _token_text(
        specials.get("pad_token") if isinstance(specials, dict) else None
    )
    if not pad:
        raise ConfigError("a ColQwen2 tokenizer needs a pad token: a query ends with ten of them")
    dim = int(config.get("embedding_dim", 128))
    return ModelInfo(
        dim=dim,
        pooling="cls",  # unused: nothing pools, every token has its vector
        normalize=False,
        inputs=("text", "image"),
        outputs=("multivector",),
        multivector=MultiVectorSpec(dim=dim, normalize=True, checkpoint="embedding_proj_layer", skiplist_tasks=()),
        image_token_id=image_token_id,
        page_prompt=prompt,
        query_prefix=str(processor.get("query_prefix") or QUERY_PREFIX),
        query_suffix=pad * QUERY_AUGMENTATION + "\n",
        image_merge=merge,
        **common,
    )


def _token_text(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: its text, or an AddedToken's {"content": ...}."""
    token = token.get("content") if isinstance(token, dict) else token
    return token if isinstance(token, str) and token else None


def _token_id(folder: ModelFolder, token: str) -> int | None:
    """The vocabulary id of ``token`` in the folder's tokenizer.json (None where it is no single token)."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(folder.path / "tokenizer.json"))
    except Exception as exc:
        raise ConfigError(f"cannot read {folder.path / 'tokenizer.json'}: {str(exc)[:200]}") from None
    return tokenizer.token_to_id(token)


def _llm_reranker(folder: ModelFolder, score_tokens: tuple[int, ...], common: dict[str, Any]) -> ModelInfo:
    """A causal-LM reranker: one logit (the last token's, from the LM head's answer-token rows), with the pair
    rendered by the chat template when sentence-transformers renders it so."""
    prompts = _prompts(folder)
    template, message_format = pair_template(folder)
    return ModelInfo(
        dim=1,
        pooling="lasttoken",
        normalize=False,
        vocab_size=int(folder.config["vocab_size"]),
        prompts=prompts,
        task="score",
        default_prompt=_default_prompt(folder, prompts),
        score_tokens=score_tokens,
        pair_template=template,
        message_format=message_format,
        score_activation=score_activation(folder),
        **common,
    )


def _prompts(folder: ModelFolder) -> dict[str, str]:
    """Input type -> the prefix put before its texts (config_sentence_transformers.json's ``prompts``;
    where it has none, the task instructions config.json holds, as jina-embeddings-v3's own code
    prefixes a task's texts with them)."""
    prompts = folder.st_general.get("prompts") or folder.config.get("task_instructions") or {}
    if not isinstance(prompts, dict):
        raise ConfigError("config_sentence_transformers.json: prompts must be a map of names to prefixes")
    return {str(k): str(v) for k, v in prompts.items()}


def task_adapters(config: dict[str, Any]) -> tuple[str, ...]:
    """The task adapters a folder's config names (jina-embeddings-v3's ``lora_adaptations``, v5's
    ``task_names``), in the order the engine numbers them."""
    names = config.get("lora_adaptations") or config.get("task_names") or []
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise ConfigError("config.json: lora_adaptations / task_names must be a list of distinct task names")
    return tuple(names)


def _default_prompt(folder: ModelFolder, prompts: dict[str, str]) -> str | None:
    name = folder.st_general.get("default_prompt_name")
    if name is None:
        return None
    if str(name) not in prompts:
        raise ConfigError(
            f"config_sentence_transformers.json: default_prompt_name {name!r} is not one of its prompts "
            f"({', '.join(prompts) or 'none'})"
        )
    return str(name)


def _truncate_dim(folder: ModelFolder) -> int | None:
    value = folder.st_general.get("truncate_dim")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"config_sentence_transformers.json: truncate_dim {value!r} is not a positive integer")
    return value
