"""Engine: packed token batches in, one pooled vector per sequence out, lazily.

One Engine is one replica: its own CUDA stream, graphs, memory pool and static buffers. Replicas
made with :meth:`Engine.replicate` share the weights. ``step`` returns at once with a result handle;
``embed`` is ``step(...).result()``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import numpy as np
import torch

from embedfleet.services.gpu_worker.engine.attention import Attention, select_attention
from embedfleet.services.gpu_worker.engine.batch import DeviceBatch, Pages, StaticBatch, prepare
from embedfleet.services.gpu_worker.engine.errors import InputTooLong, InvalidTokens, row_of
from embedfleet.services.gpu_worker.engine.graphs import GraphCache, Replay, bucket_sizes
from embedfleet.services.gpu_worker.engine.images import ImagePath, PatchImagePath
from embedfleet.services.gpu_worker.engine.linear import select_linear_ops
from embedfleet.services.gpu_worker.engine.loader import load_weights, read_safetensors
from embedfleet.services.gpu_worker.engine.models.base import EncoderModel
from embedfleet.services.gpu_worker.engine.models.registry import Family, family_for, spec_from_folder
from embedfleet.services.gpu_worker.engine.outputs import build_outputs
from embedfleet.services.gpu_worker.engine.page_pixels import PagePixels
from embedfleet.services.gpu_worker.engine.pooling import pool
from embedfleet.services.gpu_worker.engine.results import CudaResult, ReadyResult
from embedfleet.services.gpu_worker.engine.span_pooling import Spans, check_spans, span_means, span_positions
from embedfleet.services.gpu_worker.engine.st_modules import build_dense
from embedfleet.shared.config.option import ConfigError
from embedfleet.shared.images.naflex import NaFlexProcessing
from embedfleet.shared.images.pages import PageProcessing
from embedfleet.shared.images.preprocess import ImageProcessing
from embedfleet.shared.model_dir.info import ModelInfo

log = logging.getLogger("embedfleet.engine")

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# CPU batches over CPU_EXACT_TOKENS are padded to a multiple of CPU_TOKEN_STEP tokens (a dummy
# sequence, dropped after the forward); smaller ones, a query or two, run at their exact size
CPU_TOKEN_STEP = 8
CPU_EXACT_TOKENS = 32
# a CPU batch whose widest GEMM (tokens x hidden x intermediate) is under this many multiply-adds runs
# on one thread: split over an OpenMP team, each op of it pays the team's fork, join and spin (tens of
# microseconds) for a few microseconds of work each, and the spinning takes the cores the gateway,
# tokenizer and NATS need. A MiniLM query (17 x 384 x 1536: 10M) and any longer batch keep every thread.
CPU_SERIAL_MACS = 4 << 20
# padding of a bucket is under 256 tokens, so the dummy row never exceeds this or the model limit
_PAD_ROW_MAX = 256


def _to_host(made: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
    """Start the device-to-host copy of a step's output into pinned memory (float32)."""
    if isinstance(made, dict):
        return {k: _pinned_copy(v) for k, v in made.items()}
    return _pinned_copy(made)


def _pinned_copy(made: torch.Tensor) -> torch.Tensor:
    host = torch.empty(made.shape, dtype=torch.float32, pin_memory=True)
    host.copy_(made, non_blocking=True)
    return host


def default_dtype(device_type: str, config: dict) -> str:
    """The precision a model runs in when none is asked: float32 on CPU (half-precision matmuls are slow
    and lossy there); on a GPU the checkpoint's own half precision, bfloat16 where config.json saves it so
    (its activations were trained in bfloat16's range: ColQwen2, Qwen3, Gemma), else float16."""
    if device_type != "cuda":
        return "float32"
    saved = config.get("torch_dtype") or config.get("dtype")
    return "bfloat16" if saved == "bfloat16" else "float16"


def pick_device(requested: str | None) -> torch.device:
    if requested in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {requested!r} asked for, but CUDA is not available")
    return device


class Engine:
    """One model replica on one device. One ``step`` at a time per replica."""

    def __init__(
        self,
        info: ModelInfo,
        device: str | None = None,
        dtype: str | None = None,
        *,
        graphs: bool | None = None,
        attention: str = "auto",
        max_batch_tokens: int = 8192,
        max_batch_seqs: int = 256,
        capture: Callable[[Engine, int], Replay] | None = None,
        model: EncoderModel | None = None,
        heads: dict[str, torch.nn.Module] | None = None,
    ) -> None:
        self.info = info
        self.spec = spec_from_folder(info)
        self.family: Family = family_for(self.spec.config)
        self.device = pick_device(device)
        if dtype is None:
            dtype = default_dtype(self.device.type, self.spec.config or {})
        if dtype == "float16" and self.family.fp16_overflows:
            log.warning(
                "%s activations overflow float16: computing in float32 (ask for bfloat16 for half precision)",
                self.family.name,
            )
            dtype = "float32"
        self.dtype_name = dtype
        self.dtype = DTYPES[dtype]
        produced = self.spec.num_labels or self.spec.projection_dim or self.spec.hidden_size
        expected = info.dim if info.scores else info.pooled_dim
        if (info.scores or "dense" in info.outputs) and expected != produced:
            raise ConfigError(
                f"the folder's pooling or Dense layers take {expected} dimensions; the model makes {produced}"
            )
        if model is None or heads is None:
            tensors = read_safetensors(info.path)
            if model is None:
                model = self.family.model(self.spec)
                load_weights(model, tensors)
                model.load_adapters(info.path)
                model = model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
            heads = build_outputs(info, tensors, self.spec.config, self.device)
            if "sparse" in heads and info.sparse is not None and info.sparse.kind == "mlm":
                heads["sparse"].head.to(self.dtype)  # vocabulary-sized GEMMs: the encoder's precision
            del tensors
        self.model = model
        # a two-tower model's image processing (preprocessor_config.json): how its image path normalises pixels
        fixed = model.vision is not None and not info.patch_images
        self._image_processing = ImageProcessing.from_folder(info.path) if fixed else None
        self.image_path: ImagePath | None = None  # set by configure for a model with an image tower
        self.patch_path: PatchImagePath | None = None  # and this for a NaFlex model's (SigLIP 2)
        # a page model's image processing (ColQwen2): its patch rows rescaled and normalised on the device
        self.page_processing = PageProcessing.from_folder(info.path) if info.image_token_id >= 0 else None
        self._page_pixels = PagePixels(self.page_processing, self.device) if self.page_processing else None
        # the folder's other outputs (sparse, multivector), shared by replicas like the model
        self.heads = heads
        # sentence-transformers Dense layers after pooling (float32, shared by replicas like the model)
        self.dense = build_dense(info, self.device) if not info.scores and "dense" in info.outputs else None
        self.max_seq_length = min(info.max_seq_length, self.spec.max_positions - self.spec.position_offset)
        self._attention_pref = attention
        self.attention: Attention = select_attention(
            self.spec.num_heads,
            self.spec.head_dim,
            self.dtype,
            self.device,
            attention,
            kv_heads=self.spec.kv_heads,
            masks=model.masks(),
        )
        self.linear_ops = select_linear_ops(self.device, self.dtype)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._capture_fn = capture
        self._graphs_requested = graphs
        # CPU: the thread count set for this engine (--threads, or torch's default), and the batches
        # below this many tokens that run on one thread instead
        self._threads = torch.get_num_threads()
        widest = self.spec.hidden_size * max(self.spec.intermediate_size, self.spec.hidden_size)
        self._serial_tokens = CPU_SERIAL_MACS // widest if self.device.type == "cpu" else 0
        self.configure(max_batch_tokens, max_batch_seqs)

    # -- set-up -----------------------------------------------------------------------------

    def configure(self, max_batch_tokens: int, max_batch_seqs: int) -> None:
        """(Re)build the graph buckets and static buffers for a token budget and a row cap."""
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_seqs = max_batch_seqs
        use_graphs = self._graphs_requested
        if use_graphs is None:
            use_graphs = self.device.type == "cuda" and self.attention.capturable
        if use_graphs and self._capture_fn is None and not (self.device.type == "cuda" and self.attention.capturable):
            raise ConfigError(
                f"CUDA graphs need a CUDA device and a capturable attention backend (have {self.attention.name} on {self.device})"
            )
        self.graphs: GraphCache | None = None
        self._static: StaticBatch | None = None
        self._pool = None
        # graphs replay the dense forward: a model that makes no dense vectors (multi-vector only: ColBERT,
        # ColQwen2) runs every batch eagerly, and its [rows, dim] output buffer would not hold its pooled states
        if use_graphs and (self.info.scores or "dense" in self.info.outputs):
            buckets = bucket_sizes(max_batch_tokens)
            self.graphs = GraphCache(buckets, self._capture)
            # one row per sequence, one for the pad tokens
            self._static = StaticBatch(buckets[-1], max_batch_seqs + 1, self.device)
            self._static_out = torch.zeros(max_batch_seqs + 1, self.dim, dtype=torch.float32, device=self.device)
            if self.device.type == "cuda":
                self._pool = torch.cuda.graph_pool_handle()
        self._static_max_len = max(self.max_seq_length, _PAD_ROW_MAX)
        # a NaFlex model's (SigLIP 2): each image at its own grid, as patch rows (runs eagerly)
        self.patch_path = (
            PatchImagePath(
                self.model.vision,
                NaFlexProcessing.from_folder(self.info.path),
                self.device,
                self.dtype,
                self.linear_ops,
            )
            if self.model.vision is not None and self.info.patch_images
            else None
        )
        if self.model.vision is not None and self._image_processing is not None:
            self.image_path = ImagePath(
                self.model.vision, self._image_processing, self.device, self.dtype, self.linear_ops, self.dim
            )
            if use_graphs:  # as many images as the token budget holds, counted as the tower's tokens
                most = max(1, min(max_batch_seqs, max_batch_tokens // max(1, self.info.image_tokens)))
                self.image_path.use_graphs(most, self._capture_static)

    def replicate(self) -> Engine:
        """Another replica on the same device: shared weights, own stream, graphs and buffers."""
        replica = Engine(
            self.info,
            str(self.device),
            self.dtype_name,
            graphs=self._graphs_requested,
            attention=self._attention_pref,
            max_batch_tokens=self.max_batch_tokens,
            max_batch_seqs=self.max_batch_seqs,
            capture=self._capture_fn,
            model=self.model,
            heads=self.heads,
        )
        replica._threads = self._threads  # this thread may be set to one by a small batch just run
        return replica

    def describe(self) -> str:
        return (
            f"{self.info.id} ({self.family.name}, {self.spec.num_layers} layers, hidden {self.spec.hidden_size}, "
            f"{'causal' if self.spec.causal else 'bidirectional'}) "
            f"on {self.device} in {self.dtype_name}, attention {self.attention.name}, linear {self.linear_ops.name}, "
            f"graphs {'on' if self.graphs else 'off'}"
        )

    @property
    def adapter_names(self) -> tuple[str, ...]:
        """The model's task adapters: a row's adapter i (``step``'s ``adapters``) is ``adapter_names[i - 1]``."""
        return self.model.adapter_names

    @property
    def dim(self) -> int:
        """Vector size (after the folder's Dense layers), or for a classifier its number of logits."""
        return self.info.dim

    # -- checks -----------------------------------------------------------------------------

    def check(
        self,
        input_ids: np.ndarray,
        cu_seqlens: np.ndarray,
        token_types: np.ndarray | None = None,
        spans: Spans | None = None,
    ) -> None:
        """Reject token batches the model cannot take (ids outside the vocabulary, over-long rows, spans
        outside their rows): raises InvalidTokens, InputTooLong or InvalidSpans, naming the first row at fault."""
        if spans is not None:
            check_spans(spans, cu_seqlens)
        types = self.spec.type_vocab_size
        if self.model.USES_TOKEN_TYPES and token_types is not None and len(token_types) and token_types.max() >= types:
            first = int(np.argmax(token_types >= types))
            raise InvalidTokens(row_of(cu_seqlens, first), f"has token types outside [0, {types})")
        vocab = self.spec.vocab_size
        if len(input_ids) and (input_ids.min() < 0 or input_ids.max() >= vocab):
            first = int(np.argmax((input_ids < 0) | (input_ids >= vocab)))
            raise InvalidTokens(row_of(cu_seqlens, first), f"has token ids outside the vocabulary [0, {vocab})")
        lengths = np.diff(cu_seqlens)
        if len(lengths) and lengths.max() > self.max_seq_length:
            row = int(np.argmax(lengths > self.max_seq_length))
            raise InputTooLong(row, f"has {int(lengths[row])} tokens; the model's limit is {self.max_seq_length}")

    def runs_inline(self, tokens: int, outputs: tuple[str, ...], images: bool) -> bool:
        """Whether a batch is small enough to run on the caller's thread rather than the replica's: a CPU
        batch of plain dense rows below the one-thread bound (``CPU_SERIAL_MACS``), whose step costs less
        than handing it to another thread and back (at a few hundred queries a second, each such batch is a
        lone query)."""
        return (
            self.device.type == "cpu" and not images and tuple(outputs) == ("dense",) and tokens < self._serial_tokens
        )

    @property
    def image_tokens(self) -> int:
        """The tokens one image runs through the image tower (patches + class token); 0: no images."""
        return self.info.image_tokens if self.model.vision is not None else 0

    def check_images(self, pixels: np.ndarray, cu_seqlens: np.ndarray) -> None:
        """Reject image rows the model cannot take: a model without an image tower, or images of another
        shape than its processor makes (the tokenizer prepared them for another folder), counted as other
        than the tower's tokens. Raises InvalidTokens naming the batch's first row."""
        if self.image_path is None:
            raise InvalidTokens(0, f"is an image: {self.info.id} embeds texts only")
        shape = self.image_path.shape
        if tuple(pixels.shape[1:]) != shape:
            raise InvalidTokens(0, f"is an image of shape {list(pixels.shape[1:])}; {self.info.id} takes {list(shape)}")
        if np.any(np.diff(cu_seqlens) != self.image_tokens):
            raise InvalidTokens(0, f"is an image counted as other than its tower's {self.image_tokens} tokens")

    def check_pages(
        self,
        input_ids: np.ndarray,
        cu_seqlens: np.ndarray,
        pages: np.ndarray | None,
        grids: np.ndarray | None,
    ) -> None:
        """Reject a page model's rows whose images do not fit their text: the rows holding image tokens take
        the images in order, one each, and a row's image tokens must be its image's patches merged (gh * gw /
        merge**2), its grid whole merge windows within the processor's bound, the patch rows as wide as the
        folder's patches and as many as the grids say; a model that is not a page model takes none. Raises
        InvalidTokens naming the first row at fault."""
        if self.patch_path is not None:
            self._check_patch_images(input_ids, cu_seqlens, pages, grids)
            return
        proc, token = self.page_processing, self.info.image_token_id
        if proc is None:
            if pages is not None:
                raise InvalidTokens(0, f"is a page image: {self.info.id} embeds texts only")
            return
        rows = len(cu_seqlens) - 1
        marked = np.add.reduceat((input_ids == token).astype(np.int64), cu_seqlens[:-1]) if rows else np.zeros(0)
        holders = np.flatnonzero(marked)  # the rows with an image, in order
        count = 0 if grids is None else len(grids)
        if pages is None and not len(holders):
            return  # text rows alone (queries)
        if pages is None or grids is None or len(holders) != count:
            row = int(holders[count]) if len(holders) > count else rows - 1
            raise InvalidTokens(max(row, 0), f"is one of {len(holders)} rows with image tokens for {count} images")
        if pages.shape[1] != proc.row_bytes:
            raise InvalidTokens(0, f"is a page of {pages.shape[1]}-byte patches; {self.info.id} takes {proc.row_bytes}")
        m = proc.merge_size
        patches = grids[:, 0].astype(np.int64) * grids[:, 1]
        bad = (grids[:, 0] % m != 0) | (grids[:, 1] % m != 0) | (patches > proc.max_patches)
        bad |= marked[holders] != patches // (m * m)
        if np.any(bad):
            i = int(np.argmax(bad))
            raise InvalidTokens(
                int(holders[i]),
                f"has {int(marked[holders[i]])} image tokens for a {grids[i, 0]}x{grids[i, 1]}-patch image",
            )
        if len(pages) != int(patches.sum()):
            raise InvalidTokens(0, f"comes with {len(pages)} patch rows for images of {int(patches.sum())} patches")

    def _check_patch_images(
        self, input_ids: np.ndarray, cu_seqlens: np.ndarray, pages: np.ndarray | None, grids: np.ndarray | None
    ) -> None:
        """A NaFlex model's image rows: no token ids, one grid a row within the processor's most patches,
        each row counted as its grid's patches, patch rows as wide as the folder's and as many as the grids
        say. Rows without patches are texts (``check`` checks them)."""
        assert self.patch_path is not None
        if pages is None:
            return
        proc = self.patch_path.processing
        if grids is None or len(input_ids) or len(grids) != len(cu_seqlens) - 1:
            raise InvalidTokens(0, "is an image row of patches with token ids beside it, or without its grid")
        if pages.shape[1] != proc.row_bytes:
            raise InvalidTokens(
                0, f"is an image of {pages.shape[1]}-byte patches; {self.info.id} takes {proc.row_bytes}"
            )
        patches = grids[:, 0].astype(np.int64) * grids[:, 1]
        bad = (patches > proc.max_patches) | (np.diff(cu_seqlens.astype(np.int64)) != patches)
        if np.any(bad):
            i = int(np.argmax(bad))
            raise InvalidTokens(
                i,
                f"is a {grids[i, 0]}x{grids[i, 1]}-patch image counted as {int(cu_seqlens[i + 1] - cu_seqlens[i])} "
                f"tokens ({self.info.id} takes at most {proc.max_patches} patches, each row counted as its patches)",
            )
        if len(pages) != int(patches.sum()):
            raise InvalidTokens(0, f"comes with {len(pages)} patch rows for images of {int(patches.sum())} patches")

    # -- running ----------------------------------------------------------------------------

    def embed(
        self,
        input_ids: np.ndarray,
        cu_seqlens: np.ndarray,
        token_types: np.ndarray | None = None,
        skip: np.ndarray | None = None,
    ) -> np.ndarray:
        """input_ids [T] int32, cu_seqlens [B + 1] -> pooled vectors [B, dim] float32 (blocking)."""
        vectors = self.step(input_ids, cu_seqlens, token_types, skip).result()
        assert isinstance(vectors, np.ndarray)  # the dense output alone: no dict
        return vectors

    @torch.inference_mode()
    def step(
        self,
        input_ids: np.ndarray,
        cu_seqlens: np.ndarray,
        token_types: np.ndarray | None = None,
        skip: np.ndarray | None = None,
        outputs: tuple[str, ...] = ("dense",),
        spans: Spans | None = None,
        adapters: np.ndarray | None = None,
        pages: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> ReadyResult | CudaResult:
        """Launch one batch and return at once; the handle's ``result()`` gives [B, dim] float32, its
        ``run`` how the forward ran ("eager", "captured" or "replay": CUDA graphs).

        ``skip``: [B] leading (prompt) tokens of each row that pooling does not count, for a model
        whose Pooling has include_prompt=false (ignored otherwise). ``outputs``: protocol output kinds;
        anything but ``("dense",)`` runs eagerly and ``result()`` gives a dict: "dense" [B, dim],
        "sparse" [B, vocab], "tokens" [T, hidden], "multivector" [T, dim], "spans" [S, dim] (float32
        each). ``spans``: with output "spans", each row's token ranges (row-relative; a row may have
        none), each pooled into one vector (span_pooling.py), in row then span order. Inputs must have
        passed :meth:`check`. ``adapters``: [B] each row's task adapter (0: none, i: the model's
        ``adapter_names[i - 1]``), for a model that has them. ``pages``: a page model's images in the
        batch, (patch rows [P, width] uint8, grids [I, 2]) as :meth:`check_pages` passed them (runs eagerly).
        """
        if ("spans" in outputs) != (spans is not None):
            raise ValueError("spans are given exactly with the output 'spans'")
        if self.info.include_prompt:
            skip = None
        tokens, rows = int(cu_seqlens[-1]), len(cu_seqlens) - 1
        extra = tuple(outputs) != ("dense",) or pages is not None
        bucket = (
            self.graphs.bucket_for(tokens)
            if self.graphs is not None and rows <= self.max_batch_seqs and not extra
            else None
        )
        run = "eager"
        if self.device.type == "cpu":
            self._use_threads(1 if tokens < self._serial_tokens and not extra else self._threads)
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            if extra:
                made = self._eager(input_ids, cu_seqlens, token_types, skip, outputs, spans, adapters, pages)
            elif bucket is None:
                made = self._eager(input_ids, cu_seqlens, token_types, skip, adapters=adapters)
            else:
                made, run = self._graphed(input_ids, cu_seqlens, token_types, skip, bucket, adapters)
                made = made[:rows]
            if self.device.type != "cuda":
                if isinstance(made, dict):
                    return ReadyResult({k: v.numpy().copy() for k, v in made.items()}, run)
                return ReadyResult(made.numpy().copy(), run)
            host = _to_host(made)
            # blocking: the replica's thread waiting on it sleeps until the copy is done, not spinning a core
            event = torch.cuda.Event(blocking=True)
            event.record(self.stream)
            return CudaResult(host, event, run)

    def embed_images(self, pixels: np.ndarray) -> np.ndarray:
        """pixels [N, C, S, S] uint8 -> vectors [N, dim] float32 (blocking): ``step_images(...).result()``."""
        vectors = self.step_images(pixels).result()
        assert isinstance(vectors, np.ndarray)  # one output: no dict
        return vectors

    def step_images(self, pixels: np.ndarray) -> ReadyResult | CudaResult:
        """Launch one batch of images through a two-tower model's image tower and return at once:
        ``pixels`` [N, C, S, S] uint8 as the tokenizer prepared them (resized and cropped; rescaled and
        normalised here, in float32, as the folder's image processor does) -> ``result()`` [N, dim] float32."""
        path = self.image_path
        if path is None:
            raise ValueError(f"{self.info.id} takes no images")
        return self._launch_tower(lambda: path.run(pixels))

    def step_patches(self, pages: tuple[np.ndarray, np.ndarray]) -> ReadyResult | CudaResult:
        """Launch one batch of a NaFlex model's images and return at once: ``pages`` (patch rows [P, p * p * C]
        uint8, grids [N, 2]) as :meth:`check_pages` passed them -> ``result()`` [N, dim] float32."""
        path = self.patch_path
        if path is None:
            raise ValueError(f"{self.info.id} takes no images of their own size")
        return self._launch_tower(lambda: path.run(*pages))

    @torch.inference_mode()
    def _launch_tower(self, run: Callable[[], tuple[torch.Tensor, str]]) -> ReadyResult | CudaResult:
        """An image tower's batch (``run``: device vectors and how it ran) on this replica's stream, every
        CPU thread on it: its result ready (CPU) or copying to the host behind an event (CUDA)."""
        if self.device.type == "cpu":
            self._use_threads(self._threads)
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            made, how = run()
            if self.device.type != "cuda":
                return ReadyResult(made.numpy().copy(), how)
            host = _to_host(made)
            event = torch.cuda.Event(blocking=True)
            event.record(self.stream)
            return CudaResult(host, event, how)

    @staticmethod
    def _use_threads(count: int) -> None:
        """Run this thread's next ops on ``count`` threads (torch's setting is per thread under OpenMP)."""
        if torch.get_num_threads() != count:
            torch.set_num_threads(count)

    def _eager(
        self,
        input_ids: np.ndarray,
        cu_seqlens: np.ndarray,
        token_types: np.ndarray | None,
        skip: np.ndarray | None,
        outputs: tuple[str, ...] | None = None,
        spans: Spans | None = None,
        adapters: np.ndarray | None = None,
        pages: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> torch.Tensor | dict[str, torch.Tensor]:
        tokens, rows = int(cu_seqlens[-1]), len(cu_seqlens) - 1
        pad_to = None
        if self.device.type == "cpu" and tokens > CPU_EXACT_TOKENS:
            # oneDNN builds (and caches) a GEMM primitive per row count: batches padded to a multiple
            # of CPU_TOKEN_STEP reuse a few hundred shapes instead of one per token count, so the
            # cache stays small and a batch rarely pays a primitive's creation (~1 ms). A small
            # batch's GEMMs take time in proportion to its rows (an 18-token query's 24 GEMMs: 2.2 ms
            # exact, 2.8 ms padded to 24), and the 32 sizes below the threshold are few: exact.
            pad_to = -(-tokens // CPU_TOKEN_STEP) * CPU_TOKEN_STEP
        host = prepare(
            input_ids,
            cu_seqlens,
            self.spec.position_offset,
            pad_to=pad_to,
            rows_to=rows + 1 if pad_to and pad_to > tokens else None,
            token_types=token_types,
            skip=skip,
            adapters=adapters,
        )
        batch = DeviceBatch(host, self.device)
        if pages is not None:
            assert self._page_pixels is not None  # check_pages refuses pages for a model that is not a page model
            patches, grids = pages
            rows_on_device = torch.from_numpy(patches).to(self.device, non_blocking=True)
            batch.pages = Pages(
                self._page_pixels(rows_on_device).to(self.dtype), tuple((int(h), int(w)) for h, w in grids)
            )
        # the dummy row's outputs are never read: the attention may skip it
        self.attention.bind(host.cu_seqlens, batch.cu_seqlens, host.max_len, real_tokens=tokens)
        if outputs is not None:
            at = None
            if spans is not None:
                first, end = (
                    torch.from_numpy(a).to(self.device, non_blocking=True) for a in span_positions(spans, cu_seqlens)
                )
                at = (first, end)
            return self._forward_outputs(batch, outputs, rows, tokens, at)
        return self._forward(batch)[:rows]

    def _graphed(
        self,
        input_ids: np.ndarray,
        cu_seqlens: np.ndarray,
        token_types: np.ndarray | None,
        skip: np.ndarray | None,
        bucket: int,
        adapters: np.ndarray | None = None,
    ) -> tuple[torch.Tensor, str]:
        """The static output buffer, and how it was filled: "captured" or "replay" (see GraphCache.run)."""
        static, graphs = self._static, self.graphs
        assert static is not None and graphs is not None  # a bucket is chosen only where graphs are set up
        host = prepare(
            input_ids,
            cu_seqlens,
            self.spec.position_offset,
            pad_to=bucket,
            rows_to=static.max_rows,
            token_types=token_types,
            skip=skip,
            adapters=adapters,
        )
        static.load(host)
        # bounds from the static buffer, and a fixed longest-row bound, as the captured kernels expect
        self.attention.bind(host.cu_seqlens, static.cu_seqlens, self._static_max_len, graph_key=bucket)
        run = graphs.run(bucket, eager=lambda: self._static_forward(bucket))
        return self._static_out, run

    def _forward(self, batch) -> torch.Tensor:
        hidden = self.model(batch, self.attention, self.linear_ops)
        if self.model.head is not None:  # a classifier (cross-encoder): its logits
            return self.model.score(hidden, batch)
        pooled = self.model.project(pool(hidden, batch, self.info.pooling, masked=not self.info.include_prompt))
        return pooled if self.dense is None else self.dense(pooled)

    def _forward_outputs(
        self,
        batch,
        outputs: tuple[str, ...],
        rows: int,
        tokens: int,
        spans: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Every asked-for output of one forward pass (the dummy pad row and pad tokens dropped).
        ``spans``: ([S] first, [S] end) token positions in the batch, for output "spans"."""
        hidden = self.model(batch, self.attention, self.linear_ops)
        made: dict[str, torch.Tensor] = {}
        for kind in outputs:
            if kind == "dense":
                if self.model.head is not None:
                    made[kind] = self.model.score(hidden, batch)[:rows]
                else:
                    pooled = self.model.project(
                        pool(hidden, batch, self.info.pooling, masked=not self.info.include_prompt)
                    )
                    made[kind] = (pooled if self.dense is None else self.dense(pooled))[:rows]
            elif kind == "sparse":
                made[kind] = self.heads["sparse"](hidden, batch)[:rows]
            elif kind == "multivector":
                made[kind] = self.heads["multivector"](hidden[:tokens])
            elif kind == "tokens":
                made[kind] = hidden[:tokens].float()
            elif kind == "spans":
                assert spans is not None  # step() refuses output "spans" without them
                means = self.model.project(span_means(hidden, *spans))  # [S, hidden]: the post-pooling stack follows
                made[kind] = means if self.dense is None else self.dense(means)
            else:
                raise ValueError(f"unknown output {kind!r}")
        return made

    def _static_forward(self, bucket: int) -> None:
        assert self._static is not None  # captured and replayed only where graphs are set up
        self._static_out.copy_(self._forward(self._static.view(bucket)))

    def _capture(self, bucket: int) -> Replay:
        if self._capture_fn is not None:
            return self._capture_fn(self, bucket)
        replay = self._capture_static(lambda: self._static_forward(bucket))
        log.debug("captured a CUDA graph for %d tokens", bucket)
        return replay

    def _capture_static(self, forward: Callable[[], None]) -> Replay:
        """A CUDA graph of ``forward`` (a forward over static buffers) in this replica's pool and stream; with
        an injected capture (CPU tests of the bookkeeping) ``forward`` itself, replayed eagerly."""
        if self._capture_fn is not None:
            return forward
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=self.stream, capture_error_mode="thread_local"):
            forward()
        return graph.replay
