"""ColQwen2 (vidore/colqwen2-v1.0-hf, transformers' ``ColQwen2ForRetrieval``): Qwen2-VL giving a vector per
token, of a query or of a document page (an image), compared by late interaction (MaxSim).

A page is a text prompt (the processor's ``visual_prompt_prefix``) whose image token stands for the image's
tokens: Qwen2-VL's vision tower (layers/qwen2_vision.py) makes one vector per 2 x 2 patches, and those
vectors replace the embeddings of the ``image_token_id`` tokens, in order (``batch.pages``: the batch's
images, in the order their tokens come). A query is text only. Then the language model, Qwen2 (causal,
RMSNorm, grouped-query attention with qkv bias, SwiGLU: decoder.py's blocks), and its final norm; the
multi-vector head (outputs.py) projects every token's state with the checkpoint's ``embedding_proj_layer``
(float32) and L2-normalises it.

Positions: transformers' ``ColQwen2ForRetrieval.forward`` embeds the ids itself and calls the VLM with
``inputs_embeds`` and no position ids, so the language model takes plain 1-D positions (0..L-1 in each
sequence, the same in M-RoPE's three sections: ordinary RoPE), image tokens included. colpali-engine's own
ColQwen2 gives image tokens Qwen2-VL's 3-D M-RoPE positions (row and column of their window) instead; the
published -hf checkpoint is served here as transformers runs it: ``batch.positions`` as they are.

A text-only batch (queries) runs the decoder's ops alone (no host syncs, no data-dependent shapes), so it can
be captured in a CUDA graph; a batch with pages runs eagerly (its images' sizes shape the vision tower).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from embedfleet.services.gpu_worker.engine.attention import Attention
from embedfleet.services.gpu_worker.engine.layers.qwen2_vision import Qwen2VisionTower
from embedfleet.services.gpu_worker.engine.layers.vit import conv_as_linear
from embedfleet.services.gpu_worker.engine.linear import LinearOps
from embedfleet.services.gpu_worker.engine.models.decoder import DecoderEncoder
from embedfleet.services.gpu_worker.engine.spec import ModelSpec
from embedfleet.shared.model_dir import families
from embedfleet.shared.model_dir.families import QWEN2_VL_IMAGE_TOKEN_ID, vlm_text_config, vlm_vision_config


def spec(config: dict[str, Any]) -> ModelSpec:
    """The language model's sizes (vlm_config's text config); the vision tower reads ``config`` itself."""
    text = vlm_text_config(config)
    heads = int(text["num_attention_heads"])
    return ModelSpec(
        model_type="colqwen2",
        family=families.COLQWEN2.name,
        hidden_size=int(text["hidden_size"]),
        num_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads") or heads),
        num_layers=int(text["num_hidden_layers"]),
        intermediate_size=int(text["intermediate_size"]),
        vocab_size=int(text["vocab_size"]),
        max_positions=int(text["max_position_embeddings"]),
        layer_norm_eps=float(text["rms_norm_eps"]),
        activation=str(text["hidden_act"]),
        causal=True,
        config=config,
    )


def _as_qwen2(spec: ModelSpec) -> ModelSpec:
    """The language model's spec as a Qwen2 decoder's: its text config, model_type "qwen2" (what decoder.py's
    blocks, rope and masks read: qkv bias, Qwen's sliding-window rule). The family's name stays ColQwen2."""
    return replace(spec, model_type="qwen2", config={**vlm_text_config(spec.config), "model_type": "qwen2"})


class ColQwen2Model(DecoderEncoder):
    # under ColQwen2ForRetrieval's "vlm.": "model." as published (transformers 4), none as transformers 5 saves it
    PREFIXES = ("vlm.model.", "vlm.")
    PROBE = "language_model.embed_tokens.weight"

    def __init__(self, spec: ModelSpec) -> None:
        # ``self.spec`` is the Qwen2 view (_as_qwen2): the decoder's layers and weight names read it
        super().__init__(_as_qwen2(spec))
        vision = vlm_vision_config(spec.config)
        self.vision_depth = int(vision["depth"])
        self.visual = Qwen2VisionTower(vision, spec.hidden_size)
        self.image_token_id = int((spec.config.get("vlm_config") or {}).get("image_token_id", QWEN2_VL_IMAGE_TOKEN_ID))

    def forward(self, batch, attention: Attention, ops: LinearOps) -> torch.Tensor:
        x = self.word(batch.input_ids)  # [T, hidden]
        if batch.pages is not None:
            x = self.put_images(x, batch, ops)
        rope = self.rotary(batch.positions)  # plain 1-D positions, as transformers' port gives them
        for mask, layer in zip(self.layer_mask, self.layers):
            x = layer(x, rope, mask, attention, ops)
        return self.norm(x)

    def put_images(self, x: torch.Tensor, batch, ops: LinearOps) -> torch.Tensor:
        """``x`` [T, hidden] with the image tokens' rows replaced by the vision tower's vectors, in order
        (transformers' masked_scatter); a ValueError where their counts differ."""
        pages = batch.pages
        images = self.visual(pages.patches, pages.grids, ops)  # [N, hidden]
        at = torch.nonzero(batch.input_ids == self.image_token_id).squeeze(1)  # a host sync: pages run eagerly
        if at.shape[0] != images.shape[0]:
            raise ValueError(
                f"the batch holds {at.shape[0]} image tokens; its images ({list(pages.grids)}) make {images.shape[0]}"
            )
        return x.index_copy(0, at, images.to(x.dtype))

    def weight_names(self) -> dict[str, list[str]]:
        text = {ours: [f"language_model.{n}" for n in theirs] for ours, theirs in super().weight_names().items()}
        return text | Qwen2VisionTower.hf_names(self.vision_depth, "visual.", "visual.")

    def weight_tensor(self, ours: str, tensor: torch.Tensor) -> torch.Tensor:
        return conv_as_linear(tensor) if ours == "visual.patch_embed.weight" else tensor
