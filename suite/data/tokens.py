"""Synthetic token sequences for language models, deterministic from their seed.

Each sequence is a walk on a random Markov chain: every token has ``branching`` possible
successors (chosen at random, with random probabilities). A model can learn it: the best
achievable loss is the chain's entropy (at most log(branching)), far below the log(vocab)
of guessing. Inputs are tokens 0..T-1 of a walk, targets tokens 1..T (next-token prediction).
"""
from typing import Literal

import torch
from pydantic import PositiveInt, conint, model_validator
from torch.utils.data import TensorDataset

from suite.data import DataSpec
from suite.data.base import DataOptions
from suite.common.errors import SuiteError


class SyntheticTokens(DataOptions):
    name: Literal["synthetic_tokens"] = "synthetic_tokens"
    vocab: conint(ge=2) = 64
    seq_len: PositiveInt = 32
    branching: PositiveInt = 4  # successors per token: lower is easier to learn
    n_train: PositiveInt = 1024
    n_val: PositiveInt = 128
    seed: int = 0

    @model_validator(mode="after")
    def _branching_fits(self):
        if self.branching > self.vocab:
            raise SuiteError(f"data.branching={self.branching} must be at most data.vocab={self.vocab}")
        return self

    def spec(self) -> DataSpec:
        return DataSpec(self.name, (self.seq_len,), self.vocab, input_dtype="int64",
                        tokens_per_sample=self.seq_len)

    def sizes(self):
        return self.n_train, self.n_val


def load(*, vocab: int, seq_len: int, branching: int, n_train: int, n_val: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    successors = torch.stack([torch.randperm(vocab, generator=g)[:branching] for _ in range(vocab)])
    weights = torch.rand(vocab, branching, generator=g) + 0.1
    n = n_train + n_val
    walk = torch.empty(n, seq_len + 1, dtype=torch.int64)
    walk[:, 0] = torch.randint(vocab, (n,), generator=g)
    for t in range(seq_len):
        current = walk[:, t]
        choice = torch.multinomial(weights[current], 1, generator=g).squeeze(1)
        walk[:, t + 1] = successors[current, choice]
    x, y = walk[:, :-1].contiguous(), walk[:, 1:].contiguous()
    return TensorDataset(x[:n_train], y[:n_train]), TensorDataset(x[n_train:], y[n_train:])


OPTIONS = [SyntheticTokens]
