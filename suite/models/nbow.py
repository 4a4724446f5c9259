"""Neural bag of words: token embeddings pooled over the document, then one linear layer to the
classes (the NBoW sentiment classifier of the published comparisons).

``nn.Sequential(Bag, Linear)``: two blocks, so the splitting strategies can cut it between the
embedding and the classifier (legal and exact, though the classifier is tiny: a split buys memory
for the embedding table only). Padding (id 0) takes no part in the pooling: ``mean`` averages a
document's real tokens. (The published tutorial averaged over the padded length; with reviews
truncated to 256 tokens most are full-length, so the two barely differ.)
"""
from typing import ClassVar, Literal, Optional

from pydantic import PositiveInt
from torch import nn

from suite.data.text import PAD
from suite.models.base import ModelOptions, input_vocab


class NBoW(ModelOptions):
    name: Literal["nbow"] = "nbow"
    inputs: ClassVar = "tokens"
    embedding: PositiveInt = 300  # width of a word's vector
    pooling: Literal["mean", "sum", "max"] = "mean"  # over the document's tokens, padding excluded
    vocab: Optional[PositiveInt] = None  # embedding rows; default: the data's input vocabulary


OPTIONS = [NBoW]


def build(spec, *, embedding: int, pooling: str, vocab: int | None) -> nn.Sequential:
    rows = input_vocab(spec, vocab, "nbow")
    # EmbeddingBag pools without materialising (batch, length, embedding); padding_idx leaves pads out.
    bag = nn.EmbeddingBag(rows, embedding, mode=pooling, padding_idx=PAD)
    return nn.Sequential(bag, nn.Linear(embedding, spec.num_classes))
