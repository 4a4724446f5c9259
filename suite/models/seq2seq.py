"""Sequence-to-sequence encoder-decoder with LSTM or GRU cells (the published comparisons'
Seq2Seq: Sutskever et al. 2014 as in B. Trevett's tutorial), trained with teacher forcing.

It reads the samples ``suite.data.text.pack_pairs`` makes: inputs (batch, 2, length), row 0 the
source ids, row 1 the decoder's input, the gold previous target tokens (``<sos> t..``); its output
is logits (batch, length, target vocabulary) scored against the next tokens (task ``language``;
padding is ``IGNORE`` in the targets and not scored). Teacher forcing is always on (the published
code fed the model's own guess back half the time, at random; that draw would differ between rank
layouts and cannot be checked against one process).

``nn.Sequential(Encoder, Decoder, Head)``, so pipeline and layer_split can cut it between encoder,
decoder and output layer. What crosses a cut must be one float tensor (a pipeline stage sends one
activation, and mixed precision may cast it), so the Encoder block hands on, per sample, its final
state and the decoder's embedded inputs, flattened side by side; the decoder's embedding therefore
lives in the first block.
"""
from typing import ClassVar, Literal, Optional

import torch
from pydantic import PositiveFloat, PositiveInt, confloat
from torch import nn

from suite.data.text import PAD
from suite.common.errors import SuiteError
from suite.models.base import ModelOptions, input_vocab


class Seq2Seq(ModelOptions):
    name: Literal["seq2seq"] = "seq2seq"
    task = "language"
    inputs: ClassVar = None  # (2, length) token pairs: checked in build
    cell: Literal["lstm", "gru"] = "lstm"
    layers: PositiveInt = 2  # stacked recurrent layers, in the encoder and in the decoder
    embedding: PositiveInt = 256
    hidden: PositiveInt = 512
    dropout: confloat(ge=0, lt=1) = 0.5  # on embeddings and between recurrent layers
    # Every weight drawn from U(-a, a), as the published model; None keeps torch's initialisation.
    init_uniform: Optional[PositiveFloat] = 0.08


OPTIONS = [Seq2Seq]

_RNN = {"lstm": nn.LSTM, "gru": nn.GRU}


class Encoder(nn.Module):
    """Token pairs -> (batch, states x layers x hidden + length x embedding) floats."""

    def __init__(self, source_vocab, target_vocab, cell, layers, embedding, hidden, dropout):
        super().__init__()
        self.source = nn.Embedding(source_vocab, embedding, padding_idx=PAD)
        self.rnn = _RNN[cell](embedding, hidden, layers, dropout=dropout if layers > 1 else 0.0, batch_first=True)
        self.target = nn.Embedding(target_vocab, embedding, padding_idx=PAD)  # the decoder's input embedding
        self.dropout = nn.Dropout(dropout)

    def forward(self, pairs):
        source, decoder_in = pairs[:, 0], pairs[:, 1]
        # The source is padded on the left: the last step (the final state) is its last real token.
        _, state = self.rnn(self.dropout(self.source(source)))
        states = state if isinstance(state, tuple) else (state,)  # LSTM: (h, c); GRU: h
        flat = [s.transpose(0, 1).flatten(1) for s in states]  # (layers, batch, hidden) -> (batch, layers x hidden)
        embedded = self.dropout(self.target(decoder_in))
        return torch.cat([*flat, embedded.flatten(1)], dim=1)


class Decoder(nn.Module):
    """The Encoder block's floats -> the decoder's top-layer outputs (batch, length, hidden)."""

    def __init__(self, cell, layers, embedding, hidden, dropout):
        super().__init__()
        self.states, self.layers, self.hidden, self.embedding = (2 if cell == "lstm" else 1), layers, hidden, embedding
        self.rnn = _RNN[cell](embedding, hidden, layers, dropout=dropout if layers > 1 else 0.0, batch_first=True)

    def forward(self, packed):
        batch, width = len(packed), self.layers * self.hidden
        parts = [packed[:, i * width:(i + 1) * width].reshape(batch, self.layers, self.hidden).transpose(0, 1)
                 .contiguous() for i in range(self.states)]
        embedded = packed[:, self.states * width:].reshape(batch, -1, self.embedding)
        out, _ = self.rnn(embedded, tuple(parts) if self.states == 2 else parts[0])
        return out


def build(spec, *, cell: str, layers: int, embedding: int, hidden: int, dropout: float,
          init_uniform: float | None) -> nn.Sequential:
    if spec.input_dtype != "int64" or len(spec.input_shape) != 2 or spec.input_shape[0] != 2:
        shape = "x".join(map(str, spec.input_shape))
        raise SuiteError(f"model.name=seq2seq needs source/target token pairs (int64 inputs of shape 2 x length), "
                         f"but data.name={spec.name} gives {spec.input_dtype} inputs of shape {shape}; "
                         f"use data.name=synthetic_seq2seq or multi30k")
    source_vocab, target_vocab = input_vocab(spec, None, "seq2seq"), spec.num_classes
    model = nn.Sequential(Encoder(source_vocab, target_vocab, cell, layers, embedding, hidden, dropout),
                          Decoder(cell, layers, embedding, hidden, dropout),
                          nn.Linear(hidden, target_vocab))
    if init_uniform:
        for p in model.parameters():  # from torch's global generator: every rank draws the same
            nn.init.uniform_(p, -init_uniform, init_uniform)
    return model
