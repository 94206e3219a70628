"""What a model folder serves, as every service sees it: ``ModelInfo`` (made by
shared/model_dir/load.py's ``load_model_info``), and when two names mean the same model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from embedfleet.shared.model_dir.outputs import MultiVectorSpec, SparseSpec
from embedfleet.shared.model_dir.stack import DenseSpec


@dataclass(frozen=True, slots=True)
class ModelInfo:
    id: str  # the name clients use ("model" in the API)
    path: Path
    max_seq_length: int  # real limit, special tokens included
    dim: int  # output dimension (after the last Dense layer, if any)
    pooling: str  # one of stack.POOLING_MODES
    normalize: bool  # modules.json has a Normalize module
    vocab_size: int
    prompts: dict[str, str]  # input type -> prefix, from config_sentence_transformers.json
    task: str = "embed"  # "embed": vectors; "score": a cross-encoder's relevance logits (dim = labels)
    include_prompt: bool = True  # pooling counts the prompt's tokens (False: INSTRUCTOR-style, they are skipped)
    dense: tuple[DenseSpec, ...] = ()  # Dense layers applied to the pooled vector, in order
    default_prompt: str | None = None  # the name (a key of prompts) used when a request names none
    truncate_dim: int | None = None  # Matryoshka: encode output is cut to this many dimensions by default
    # a causal-LM reranker (modules.json: Transformer -> LogitScore): the vocabulary ids whose last-token
    # logits make its one score, (true,) for logit[true] or (true, false) for logit[true] - logit[false]
    score_tokens: tuple[int, ...] = ()
    pair_template: str | None = None  # the chat template (Jinja) a (query, document) pair is rendered with
    message_format: str = "flat"  # the template's message content: "flat" (a string) or "structured" (parts)
    score_activation: str = "sigmoid"  # a reranker's score from its logit: "sigmoid" or "identity"
    # what it makes, of "dense", "sparse", "multivector" ("tokens": any embedder; "spans": any that makes "dense")
    outputs: tuple[str, ...] = ("dense",)
    sparse: SparseSpec | None = None
    multivector: MultiVectorSpec | None = None
    hidden_size: int = 0  # the encoder's width (the "tokens" output's dimension)
    labels: tuple[str, ...] = ()  # a sequence classifier's label names, by logit (config.json's id2label)
    # the task adapters a request may choose (``task``): config.json's lora_adaptations (jina-embeddings-v3)
    adapters: tuple[str, ...] = ()
    # the kinds of input it embeds: ("text",), or ("text", "image") for a two-tower model (CLIP) or a page model
    inputs: tuple[str, ...] = ("text",)
    image_tokens: int = 0  # what one image runs through a two-tower model's image tower (patches + class token)
    # each image at its own size (SigLIP 2 NaFlex): it travels as patch rows with its grid, counted as its
    # patches, and ``image_tokens`` is the most an image has (the processor's max_num_patches)
    patch_images: bool = False
    # a page model (ColQwen2): an image (a document page) becomes image tokens inside a text prompt, and the
    # language model gives every token of it, as of a query, a vector ("multivector")
    image_token_id: int = -1  # the token an image's features replace; >= 0 marks a page model
    # the text a page is embedded as: one ``image_token_id`` token in it stands for the image's
    # (gh * gw / image_merge**2) tokens (ColQwen2Processor's visual_prompt_prefix)
    page_prompt: str = ""
    query_prefix: str = ""  # put before a query's text ("Query: ")
    query_suffix: str = ""  # put after it (ColQwen2: ten pad tokens, the model's query augmentation, then "\n")
    image_merge: int = 0  # patches merged into one image token along each side (2: a token per 2x2 patches)
    # every text row padded to this many tokens with ``pad_id`` (SigLIP's text tower was trained so); 0: none
    pad_to: int = 0
    pad_id: int = 0

    def serves(self, output: str) -> bool:
        """Whether a request for ``output`` (a protocol OUTPUTS name) can be served by this model."""
        if self.scores:
            return output == "dense"
        if output == "spans":  # late chunking: the token states pooled by span, then the dense stack
            return "dense" in self.outputs
        return output == "tokens" or output in self.outputs

    @property
    def pages(self) -> bool:
        """A page model: its images are embedded inside ``page_prompt``, a vector per token."""
        return self.image_token_id >= 0

    @property
    def scores(self) -> bool:
        return self.task == "score"

    @property
    def pooled_dim(self) -> int:
        """The pooled vector's dimension (the encoder's output), before any Dense layer."""
        return self.dense[0].in_features if self.dense else self.dim


def same_model(requested: str, served_id: str) -> bool:
    """'sentence-transformers/all-MiniLM-L6-v2' and 'all-MiniLM-L6-v2' both name the same model."""
    return requested == served_id or requested.rsplit("/", 1)[-1] == served_id.rsplit("/", 1)[-1]
