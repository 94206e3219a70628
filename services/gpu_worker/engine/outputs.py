"""Outputs beyond one pooled vector, from the same forward pass: sparse vectors, token vectors, multi-vectors.

- sparse, "mlm" (SPLADE, sentence-transformers' SparseEncoder): the masked-LM head's logits per token
  -> log(1 + relu(x)) (once more for log1p_relu) -> max or sum over each row's tokens: [R, vocab].
  The logits are made a slice of tokens at a time, so a batch never holds [T, vocab] at once.
- sparse, "linear" (BGE-M3): w = relu(sparse_linear(h)) per token; each row keeps the largest w of
  every token id (its special tokens get none): [R, vocab].
- multivector: the folder's per-token Dense layers (or BGE-M3's colbert_linear, or a Linear of the model's
  own checkpoint: ColQwen2's embedding_proj_layer), then L2 norm: [T, dim].
- tokens: the last hidden states as they are: [T, hidden].

Rows of a padded batch beyond the real ones are computed and dropped by the caller, as for pooling.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from embedfleet.services.gpu_worker.engine.st_modules import DenseStack
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.model_dir.info import ModelInfo
from embedfleet.shared.model_dir.linear_heads import read_linear
from embedfleet.shared.model_dir.outputs import MultiVectorSpec, SparseSpec

# index_reduce_ ("amax" over each row's tokens) is marked beta; its results are exact
warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta")

# logits made at once by the SPLADE head: tokens x vocabulary entries (float32: 64 MB)
_LOGIT_CHUNK = 1 << 24

# masked-LM head names: (prefix of the transform, its norm, the decoder weight, the output bias)
_MLM_LAYOUTS = (
    # BERT: cls.predictions.{transform.dense, transform.LayerNorm, decoder, bias}
    (
        "cls.predictions.transform.dense",
        "cls.predictions.transform.LayerNorm",
        "cls.predictions.decoder",
        ("cls.predictions.bias", "cls.predictions.decoder.bias"),
    ),
    # RoBERTa / XLM-R / CamemBERT: lm_head.{dense, layer_norm, decoder, bias}
    ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", ("lm_head.bias", "lm_head.decoder.bias")),
)
_WORD_EMBEDDINGS = (
    "bert.embeddings.word_embeddings.weight",
    "roberta.embeddings.word_embeddings.weight",
    "embeddings.word_embeddings.weight",
)


class MlmHead(nn.Module):
    """BERT's / RoBERTa's masked-LM head: dense -> GELU -> LayerNorm -> decoder (tied to the embeddings)."""

    def __init__(self, hidden: int, vocab: int, eps: float) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(F.gelu(self.dense(h))))

    @classmethod
    def from_checkpoint(cls, tensors: dict[str, torch.Tensor], config: dict) -> MlmHead:
        act = str(config.get("hidden_act", "gelu"))
        if act not in ("gelu", "gelu_new", "gelu_python") and config.get("model_type") == "bert":
            raise ConfigError(f"SPLADE: a masked-LM head with hidden_act {act!r} is not supported (gelu only)")
        for dense, norm, decoder, biases in _MLM_LAYOUTS:
            if f"{dense}.weight" not in tensors:
                continue
            weight = tensors.get(f"{decoder}.weight")
            if weight is None:  # tied to the input embeddings, as transformers saves it
                weight = next((tensors[n] for n in _WORD_EMBEDDINGS if n in tensors), None)
            bias = next((tensors[n] for n in biases if n in tensors), None)
            gamma = tensors.get(f"{norm}.weight", tensors.get(f"{norm}.gamma"))
            beta = tensors.get(f"{norm}.bias", tensors.get(f"{norm}.beta"))
            if weight is None or bias is None or gamma is None or beta is None:
                break
            head = cls(weight.shape[1], weight.shape[0], float(config.get("layer_norm_eps", 1e-12)))
            with torch.no_grad():
                head.dense.weight.copy_(tensors[f"{dense}.weight"])
                head.dense.bias.copy_(tensors[f"{dense}.bias"])
                head.norm.weight.copy_(gamma)
                head.norm.bias.copy_(beta)
                head.decoder.weight.copy_(weight)
                head.decoder.bias.copy_(bias)
            return head
        raise ConfigError(
            "SPLADE needs a masked-LM head (BERT's cls.predictions.* or RoBERTa's lm_head.*); "
            "the checkpoint has neither"
        )


def _linear(path, expect_in: int) -> nn.Linear:
    tensors = read_linear(path)
    weight = torch.from_numpy(tensors["weight"])
    if weight.shape[1] != expect_in:
        raise ConfigError(f"{path}: weight takes {weight.shape[1]} inputs, the model's hidden size is {expect_in}")
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias="bias" in tensors)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if "bias" in tensors:
            linear.bias.copy_(torch.from_numpy(tensors["bias"]))
    return linear


class SparseOutput(nn.Module):
    dropped: torch.Tensor  # [n] int64 token ids whose weight is 0, a buffer (registered in __init__)

    def __init__(
        self, spec: SparseSpec, vocab: int, hidden: int, tensors: dict[str, torch.Tensor], config: dict
    ) -> None:
        super().__init__()
        self.spec = spec
        self.vocab = vocab
        if spec.kind == "mlm":
            self.head: nn.Module = MlmHead.from_checkpoint(tensors, config)
            if self.head.decoder.out_features != vocab:
                raise ConfigError(
                    f"the masked-LM head makes {self.head.decoder.out_features} logits; the vocabulary has {vocab}"
                )
        else:
            self.head = _linear(spec.weights, hidden)
            if self.head.out_features != 1:
                raise ConfigError(
                    f"{spec.weights}: sparse_linear must make one weight per token, not {self.head.out_features}"
                )
        self.register_buffer("dropped", torch.tensor(spec.dropped, dtype=torch.int64), persistent=False)

    def forward(self, hidden: torch.Tensor, batch) -> torch.Tensor:
        rows = batch.lengths.shape[0]
        out = torch.zeros(rows, self.vocab, dtype=torch.float32, device=hidden.device)
        if self.spec.kind == "linear":
            assert isinstance(self.head, nn.Linear)  # made so in __init__
            w = torch.relu(self.head(hidden.to(self.head.weight.dtype))).squeeze(1).float()  # [T]
            if len(self.dropped):
                w = w.masked_fill(torch.isin(batch.input_ids, self.dropped), 0.0)
            flat = batch.seq_ids * self.vocab + batch.input_ids
            return out.view(-1).scatter_reduce_(0, flat, w, reduce="amax").view(rows, self.vocab)
        step = max(1, _LOGIT_CHUNK // self.vocab)
        assert isinstance(self.head, MlmHead)  # the other kind, made so in __init__
        head_dtype = self.head.dense.weight.dtype
        for lo in range(0, hidden.shape[0], step):
            logits = self.head(hidden[lo : lo + step].to(head_dtype)).float()
            values = torch.log1p(torch.relu(logits))
            if self.spec.activation == "log1p_relu":
                values = torch.log1p(values)
            seq = batch.seq_ids[lo : lo + step]
            if self.spec.pooling == "max":  # values >= 0: the zeros out starts with are the identity
                out.index_reduce_(0, seq, values, "amax", include_self=True)
            else:
                out.index_add_(0, seq, values)
        return out


def _checkpoint_linear(tensors: dict[str, torch.Tensor], prefix: str, expect_in: int, expect_out: int) -> nn.Linear:
    """The Linear a checkpoint keeps under ``prefix`` ("<prefix>.weight" [out, in], "<prefix>.bias" [out] if any),
    checked to take the model's ``expect_in`` and make the folder's ``expect_out`` dimensions (0: any)."""
    weight, bias = tensors.get(f"{prefix}.weight"), tensors.get(f"{prefix}.bias")
    if weight is None:
        raise ConfigError(f"checkpoint is missing tensor {prefix + '.weight'!r} (the multi-vector projection)")
    if weight.dim() != 2 or weight.shape[1] != expect_in or (expect_out and weight.shape[0] != expect_out):
        raise ConfigError(
            f"{prefix}.weight has shape {tuple(weight.shape)}: expected [{expect_out or 'out'}, {expect_in}] "
            "(the vector size the config says, the model's hidden size)"
        )
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


class MultiVectorOutput(nn.Module):
    def __init__(self, spec: MultiVectorSpec, hidden: int, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.spec = spec
        if spec.checkpoint:
            self.proj: nn.Module = _checkpoint_linear(tensors, spec.checkpoint, hidden, spec.dim)
        elif spec.linear is not None:
            self.proj = _linear(spec.linear, hidden)
        elif spec.dense:
            self.proj = DenseStack(spec.dense)
        else:
            self.proj = nn.Identity()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        vectors = self.proj(hidden.float())
        return F.normalize(vectors, dim=-1) if self.spec.normalize else vectors


def build_outputs(
    info: ModelInfo, tensors: dict[str, torch.Tensor], config: dict, device: torch.device
) -> dict[str, nn.Module]:
    """The heads of the folder's extra outputs (float32; the model's own dtype for the SPLADE head)."""
    heads: dict[str, nn.Module] = {}
    if info.sparse is not None:
        heads["sparse"] = SparseOutput(info.sparse, info.vocab_size, info.hidden_size, tensors, config)
    if info.multivector is not None:
        heads["multivector"] = MultiVectorOutput(info.multivector, info.hidden_size, tensors)
    return {k: m.to(device).eval().requires_grad_(False) for k, m in heads.items()}
