"""Synthetic text tasks, deterministic from their seed, that a model can truly learn (token ids as
``suite.data.text`` lays them out: 0-3 are the specials, words and symbols start at 4).

- ``synthetic_sentiment``: documents of random neutral words, ``min_len`` to ``seq_len`` long, in
  which ``planted`` words of the label's own sentiment set replace random positions. Only those
  words carry the label, so a bag of words can learn it: the loss falls from ln 2 towards 0.
- ``synthetic_seq2seq``: random symbol sequences, ``min_len`` to ``max_len`` long; the target is
  the sequence itself (``task: copy``) or reversed (``reverse``). Guessing costs ln(vocabulary).
"""
from typing import Literal

import torch
from pydantic import PositiveInt, conint, model_validator
from torch.utils.data import TensorDataset

from suite.data import DataSpec
from suite.data.base import DataOptions
from suite.data.text import SPECIALS, pack_pairs, pad_rows
from suite.common.errors import SuiteError


class _Sized(DataOptions):
    n_train: PositiveInt = 2048
    n_val: PositiveInt = 256
    seed: int = 0

    def sizes(self):
        return self.n_train, self.n_val

    def _check_lengths(self, longest: str):
        if self.min_len > getattr(self, longest):
            raise SuiteError(f"data.min_len={self.min_len} must be at most data.{longest}={getattr(self, longest)}")
        return self


class SyntheticSentiment(_Sized):
    name: Literal["synthetic_sentiment"] = "synthetic_sentiment"
    vocab: conint(ge=3) = 1000  # words, besides the specials: 2 x sentiment_words of them carry a label
    sentiment_words: PositiveInt = 10  # words per label (positive, negative)
    planted: PositiveInt = 3  # sentiment words in each document
    min_len: PositiveInt = 16
    seq_len: PositiveInt = 64  # longest document; shorter ones are padded

    @model_validator(mode="after")
    def _fits(self):
        if 2 * self.sentiment_words >= self.vocab:
            raise SuiteError(f"data.vocab={self.vocab} must exceed 2 x data.sentiment_words={self.sentiment_words} "
                             f"(the rest are the neutral words)")
        if self.planted > self.min_len:
            raise SuiteError(f"data.planted={self.planted} must be at most data.min_len={self.min_len}")
        return self._check_lengths("seq_len")

    def spec(self) -> DataSpec:
        return DataSpec(self.name, (self.seq_len,), 2, "int64", self.seq_len, len(SPECIALS) + self.vocab)

    def factory(self):
        return load_sentiment


def load_sentiment(*, vocab: int, sentiment_words: int, planted: int, min_len: int, seq_len: int,
                   n_train: int, n_val: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    n, first = n_train + n_val, len(SPECIALS)
    labels = torch.randint(2, (n,), generator=g)
    neutral = first + 2 * sentiment_words  # ids [first, neutral) are the two sentiment sets
    docs = torch.randint(neutral, first + vocab, (n, seq_len), generator=g)
    marks = first + labels[:, None] * sentiment_words + torch.randint(sentiment_words, (n, planted), generator=g)
    lengths = torch.randint(min_len, seq_len + 1, (n,), generator=g).tolist()
    rows = []
    for doc, mark, length in zip(docs.tolist(), marks.tolist(), lengths):
        doc = doc[:length]
        for position, word in zip(torch.randperm(length, generator=g)[:planted].tolist(), mark):
            doc[position] = word
        rows.append(doc)
    x = pad_rows(rows, seq_len)
    return TensorDataset(x[:n_train], labels[:n_train]), TensorDataset(x[n_train:], labels[n_train:])


class SyntheticSeq2Seq(_Sized):
    name: Literal["synthetic_seq2seq"] = "synthetic_seq2seq"
    task: Literal["copy", "reverse"] = "reverse"  # the target: the source as it is, or reversed
    vocab: conint(ge=2) = 16  # symbols, besides the specials (source and target share them)
    min_len: PositiveInt = 3
    max_len: PositiveInt = 8  # longest symbol sequence; samples hold max_len + 2 positions (<sos>, <eos>)

    @model_validator(mode="after")
    def _fits(self):
        return self._check_lengths("max_len")

    def spec(self) -> DataSpec:
        vocab = len(SPECIALS) + self.vocab
        return DataSpec(self.name, (2, self.max_len + 2), vocab, "int64", self.max_len + 2, vocab)

    def factory(self):
        return load_seq2seq


def load_seq2seq(*, task: str, vocab: int, min_len: int, max_len: int, n_train: int, n_val: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    n, first = n_train + n_val, len(SPECIALS)
    symbols = torch.randint(first, first + vocab, (n, max_len), generator=g).tolist()
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=g).tolist()
    sources = [s[:length] for s, length in zip(symbols, lengths)]
    targets = [s[::-1] if task == "reverse" else s for s in sources]
    x, y = pack_pairs(sources, targets, max_len + 2)
    return TensorDataset(x[:n_train], y[:n_train]), TensorDataset(x[n_train:], y[n_train:])


OPTIONS = [SyntheticSentiment, SyntheticSeq2Seq]
