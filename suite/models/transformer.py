"""A small decoder-only transformer language model (GPT-style, pre-norm, causal attention).

``nn.Sequential(Embedding, Block x layers, Head)`` so pipelines can split between blocks and
FSDP can shard block by block. Attention keeps q, k and v as separate projections and infers
the number of heads from the projected width, so that a tensor-parallel layout can shard them
column-wise (each rank then computes its own heads) without touching this code.
No dropout: runs stay deterministic, which the parity checks rely on.
"""
from typing import ClassVar, Literal, Optional

import torch
import torch.nn.functional as F
from pydantic import PositiveInt, model_validator
from torch import nn

from suite.common.errors import SuiteError
from suite.models.attention import Kernel, attend
from suite.models.base import ModelOptions


class Transformer(ModelOptions):
    name: Literal["transformer"] = "transformer"
    inputs: ClassVar = "tokens"
    task = "language"
    vocab: Optional[PositiveInt] = None  # default: the data's vocabulary
    seq_len: Optional[PositiveInt] = None  # longest context (positions); default: the data's
    dim: PositiveInt = 64
    heads: PositiveInt = 4
    layers: PositiveInt = 2
    mlp_ratio: PositiveInt = 4
    attention: Kernel = "fused"  # or "math": scores written out, as before fused kernels (models/attention.py)

    @model_validator(mode="after")
    def _heads_divide_dim(self):
        if self.dim % self.heads:
            raise SuiteError(f"model.dim={self.dim} must be a multiple of model.heads={self.heads}")
        return self


OPTIONS = [Transformer]


class Embedding(nn.Module):
    def __init__(self, vocab: int, seq_len: int, dim: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(seq_len, dim)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tokens(tokens) + self.positions(positions)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kernel: Kernel = "fused"):
        super().__init__()
        self.head_dim, self.kernel = dim // heads, kernel
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        batch, length, _ = x.shape
        # -1 heads: the full count on one rank, the local share under tensor parallelism.
        q, k, v = (p(x).view(batch, length, -1, self.head_dim).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        y = attend(q, k, v, self.kernel)
        return self.out(y.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int, kernel: Kernel = "fused"):
        super().__init__()
        self.attention_norm, self.attention = nn.LayerNorm(dim), Attention(dim, heads, kernel)
        self.mlp_norm, self.mlp = nn.LayerNorm(dim), MLP(dim, mlp_ratio * dim)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def build(spec, *, vocab: int | None, seq_len: int | None, dim: int, heads: int, layers: int,
          mlp_ratio: int, attention: Kernel = "fused") -> nn.Sequential:
    (length,) = spec.input_shape
    vocab, seq_len = vocab or spec.num_classes, seq_len or length
    if vocab < spec.num_classes or seq_len < length:
        raise SuiteError(f"model.vocab={vocab} / model.seq_len={seq_len} must be at least the data's "
                         f"{spec.num_classes} / {length}; leave them unset to take the data's")
    blocks = [Block(dim, heads, mlp_ratio, attention) for _ in range(layers)]
    head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, vocab))
    return nn.Sequential(Embedding(vocab, seq_len, dim), *blocks, head)
