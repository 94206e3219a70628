"""A mixture-of-experts MLP over a packed batch (nomic-embed-text-v2-moe's MoE layers).

A linear router without bias scores each token against every expert; the softmax of those scores
(in float32) picks the ``top_k`` experts of the token, whose probabilities weight their outputs
(not renormalised to sum to 1); the weighted outputs are summed and one bias, shared by the
experts and not weighted, is added. An expert is a plain two-layer MLP without biases:
down(act(up(x))), the up rows of expert e being ``w1[e]`` ([intermediate, hidden]) and the down
projection ``w2[e]`` stored the same way round ([intermediate, hidden], applied untransposed).

Two ways to run the experts, the same sums:
- ``grouped`` (eager): the (token, expert) pairs sorted by expert, then one GEMM pair per expert
  over its tokens. How many tokens an expert gets is known only on the host (one sync a layer), so
  the shapes depend on the batch: no CUDA graph can hold this.
- ``dense`` (under CUDA-graph capture): every expert over every token, each output weighted by the
  token's router weight for it (zero off its top-k). Fixed shapes and no sync, at num_experts / top_k
  times the expert GEMMs' work.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from embedfleet.services.gpu_worker.engine.linear import LinearOps, activation


class MoEMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, act: str) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k {top_k} must be between 1 and num_experts {num_experts}")
        self.num_experts, self.top_k = num_experts, top_k
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(num_experts, intermediate, hidden))  # up: [E, I, H]
        self.w2 = nn.Parameter(torch.empty(num_experts, intermediate, hidden))  # down: [E, I, H], x @ w2[e]
        self.bias = nn.Parameter(torch.zeros(hidden))  # added once to the weighted sum
        self.act = activation(act)  # an unknown activation fails at build, not at the first batch

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> (weights [T, top_k] in x's dtype, experts [T, top_k] int64)."""
        probs = F.linear(x, self.router.weight).softmax(dim=-1, dtype=torch.float32)  # [T, E]
        weights, experts = probs.topk(self.top_k, dim=-1)
        return weights.to(x.dtype), experts

    def expert(self, x: torch.Tensor, e: int) -> torch.Tensor:
        """Expert ``e`` on x: [N, hidden] -> [N, hidden]."""
        return self.act(F.linear(x, self.w1[e])) @ self.w2[e]

    def forward(self, x: torch.Tensor, ops: LinearOps, residual: torch.Tensor | None = None) -> torch.Tensor:
        # x: [T, hidden] -> [T, hidden] (+ residual). ``ops`` is unused: the expert GEMMs are plain torch
        weights, experts = self.route(x)
        capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
        out = (self.dense if capturing else self.grouped)(x, weights, experts) + self.bias
        return out if residual is None else out + residual

    def grouped(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """The weighted sum of each token's experts [T, hidden], tokens batched per expert (eager only)."""
        t, k = experts.shape
        order = experts.flatten().argsort(stable=True)  # [T * k] pairs, grouped by expert
        counts = torch.bincount(experts.flatten(), minlength=self.num_experts).tolist()  # host sync
        rows = x[order // k]  # [T * k, hidden]: each pair's token, in expert order
        outs = [self.expert(chunk, e) for e, chunk in enumerate(rows.split(counts)) if chunk.shape[0]]
        if not outs:  # no tokens
            return torch.zeros_like(x)
        grouped = torch.cat(outs)  # [T * k, hidden], pairs in expert order
        per_pair = torch.empty_like(grouped)
        per_pair[order] = grouped  # back in (token, choice) order
        return (per_pair.view(t, k, -1) * weights.unsqueeze(-1)).sum(dim=1)

    def dense(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """The same sum with every expert over every token (fixed shapes: CUDA-graph capture)."""
        gate = torch.zeros(x.shape[0], self.num_experts, dtype=x.dtype, device=x.device)
        gate.scatter_(1, experts, weights)  # [T, E]: the router weight where chosen, 0 elsewhere
        out = torch.zeros_like(x)
        for e in range(self.num_experts):
            g = gate[:, e : e + 1]
            # where, not a product: an expert's inf on a token that did not choose it stays out
            out += torch.where(g > 0, self.expert(x, e) * g, 0.0)
        return out
