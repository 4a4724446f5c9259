"""Text read from its usual on-disk forms under ``data.root`` (default ``data/``, or $SCALESUITE_DATA),
turned into token ids with a simple tokenizer and a vocabulary built from the training split only.

- ``imdb``: the IMDB review release as it unpacks (``aclImdb/train/pos/*.txt``, ``train/neg/*.txt``,
  ``test/pos/*.txt``, ``test/neg/*.txt``; one review per file; ``train/unsup`` is not read). Labels:
  neg 0, pos 1. Each review is truncated to ``max_len`` tokens and padded to it.
- ``multi30k``: parallel text, one sentence per line, the two sides of a split line by line
  (``multi30k/train.de`` + ``train.en``, ``val.de`` + ``val.en``). A pair is packed for the
  ``seq2seq`` model (``pack_pairs``).

Token ids: 0 ``<pad>``, 1 ``<unk>``, 2 ``<sos>``, 3 ``<eos>``, then the words of the training split
seen at least ``min_freq`` times, most frequent first (ties alphabetical), at most ``max_vocab`` ids in
all. Target positions that are not scored (padding) hold ``suite.data.IGNORE`` (-100), which the
language task's loss, accuracy and perplexity skip.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Literal, Optional

import torch
from pydantic import PositiveInt, PrivateAttr, confloat, conint
from torch.utils.data import TensorDataset

from suite.data import IGNORE, DataSpec
from suite.data.base import DataOptions
from suite.common.errors import SuiteError

SPECIALS = ("<pad>", "<unk>", "<sos>", "<eos>")
PAD, UNK, SOS, EOS = range(4)

# The basic_english rules of torchtext: lower-case; split off ' . , ( ) ! ?; drop "; HTML line
# breaks, ; and : become spaces; then split on whitespace.
_RULES = [(re.compile(p), r) for p, r in [
    (r"\'", " '  "), (r"\"", ""), (r"\.", " . "), (r"<br \/>", " "), (r",", " , "), (r"\(", " ( "),
    (r"\)", " ) "), (r"\!", " ! "), (r"\?", " ? "), (r"\;", " "), (r"\:", " "), (r"\s+", " ")]]


def tokenize(line: str) -> list[str]:
    """Lower-cased word and punctuation tokens (torchtext's ``basic_english``)."""
    line = line.lower()
    for pattern, replacement in _RULES:
        line = pattern.sub(replacement, line)
    return line.split()


class Vocab:
    """Words to ids: the specials first, then the words of the given (training) token lists."""

    def __init__(self, words: list[str]):
        self.words = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.ids = {w: i for i, w in enumerate(self.words)}

    @classmethod
    def build(cls, token_lists, min_freq: int = 1, max_vocab: int | None = None) -> "Vocab":
        counts = Counter(t for tokens in token_lists for t in tokens)
        ranked = sorted((w for w, n in counts.items() if n >= min_freq), key=lambda w: (-counts[w], w))
        return cls(ranked[:max_vocab - len(SPECIALS)] if max_vocab else ranked)

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, tokens: list[str]) -> list[int]:
        return [self.ids.get(t, UNK) for t in tokens]


def pad_rows(rows: list[list[int]], length: int, fill: int = PAD, left: bool = False) -> torch.Tensor:
    """(len(rows), length) int64: each row truncated to ``length`` and padded with ``fill``."""
    out = torch.full((len(rows), length), fill, dtype=torch.int64)
    for i, row in enumerate(rows):
        row = row[:length]
        if row:
            (out[i, length - len(row):] if left else out[i, :len(row)]).copy_(torch.tensor(row))
    return out


def pack_pairs(sources: list[list[int]], targets: list[list[int]], length: int):
    """Sequence-to-sequence samples as the ``seq2seq`` model reads them (teacher forcing):

    - inputs (N, 2, length): row 0 the source ``<sos> s.. <eos>``, padded on the LEFT so that the
      encoder's last step is the source's last token; row 1 the decoder's input, the gold previous
      tokens ``<sos> t..`` (padded on the right);
    - targets (N, length): what the decoder must predict at each position, ``t.. <eos>``, then
      ``IGNORE``. Sequences longer than ``length - 2`` tokens are truncated."""
    keep = length - 2
    src = pad_rows([[SOS, *s[:keep], EOS] for s in sources], length, left=True)
    full = [[SOS, *t[:keep], EOS] for t in targets]
    decoder_in = pad_rows([t[:-1] for t in full], length)
    return torch.stack([src, decoder_in], dim=1), pad_rows([t[1:] for t in full], length, fill=IGNORE)


class _TextFolder(DataOptions):
    """Read from ``root/folder``; loaded once per options object (the spec needs the vocabulary)."""
    root: str = os.environ.get("SCALESUITE_DATA", "data")
    _loaded = PrivateAttr(default=None)

    def directory(self) -> Path:
        return Path(self.root).expanduser().resolve() / self.folder

    def loaded(self):
        if self._loaded is None:
            self._loaded = super().loaded()
        return self._loaded

    def sizes(self):
        try:
            self.check_available()
        except SuiteError:
            return None  # reported by check_available itself
        train, val, _ = self.loaded()
        return len(train), len(val)

    def check_available(self) -> None:
        """SuiteError naming data.root / data.folder and the layout unless every glob pattern of
        ``expected()`` (relative to the folder) matches a file."""
        patterns, layout = self.expected()
        where = self.directory()
        missing = [p for p in patterns if not where.is_dir() or not any(where.glob(p))]
        if missing:
            raise SuiteError(f"data set {self.name} not found in {where}: no {', '.join(missing)}; expected {layout} "
                             f"there (data.root={self.root!r}, data.folder={self.folder!r})")


# ---- IMDB --------------------------------------------------------------------------------

class Imdb(_TextFolder):
    name: Literal["imdb"] = "imdb"
    folder: str = "aclImdb"
    max_len: PositiveInt = 256  # tokens kept per review (truncated, then padded to this)
    min_freq: PositiveInt = 5  # a word of the training split enters the vocabulary this often
    max_vocab: Optional[conint(ge=len(SPECIALS) + 1)] = None  # ids in all, specials included
    # None: validate on test/; else this share of train/ (after a shuffle by seed), the rest trains.
    val_fraction: Optional[confloat(gt=0, lt=1)] = None
    seed: int = 0

    def expected(self) -> tuple[list[str], str]:
        splits = ["train"] if self.val_fraction else ["train", "test"]
        folders = [f"{s}/{c}" for s in splits for c in ("pos", "neg")]
        return [f"{f}/*.txt" for f in folders], f"the IMDB release layout, one review per .txt file in {', '.join(folders)}"

    def factory(self):
        return load_imdb


def load_imdb(*, root: str, folder: str, max_len: int, min_freq: int, max_vocab: int | None,
              val_fraction: float | None, seed: int):
    opts = Imdb(root=root, folder=folder, val_fraction=val_fraction)
    opts.check_available()
    where = opts.directory()
    g = torch.Generator().manual_seed(seed)
    texts, labels = _reviews(where / "train", g)
    if val_fraction:
        n_val = max(1, round(len(texts) * val_fraction))
        val_texts, val_labels = texts[len(texts) - n_val:], labels[len(texts) - n_val:]
        texts, labels = texts[:len(texts) - n_val], labels[:len(texts) - n_val]
    else:
        val_texts, val_labels = _reviews(where / "test", g)
    train_tokens = [tokenize(t)[:max_len] for t in texts]
    vocab = Vocab.build(train_tokens, min_freq, max_vocab)  # from the training split only
    x_train = pad_rows([vocab.encode(t) for t in train_tokens], max_len)
    x_val = pad_rows([vocab.encode(tokenize(t)[:max_len]) for t in val_texts], max_len)
    spec = DataSpec("imdb", (max_len,), 2, "int64", max_len, input_vocab=len(vocab))
    return (TensorDataset(x_train, torch.tensor(labels)), TensorDataset(x_val, torch.tensor(val_labels)), spec)


def _reviews(split: Path, g: torch.Generator) -> tuple[list[str], list[int]]:
    """A split's reviews and labels (neg 0, pos 1), shuffled so that a prefix (limit_train) holds both."""
    files = [(p, label) for label, c in enumerate(("neg", "pos")) for p in sorted((split / c).glob("*.txt"))]
    order = torch.randperm(len(files), generator=g).tolist()
    return ([files[i][0].read_text(encoding="utf-8", errors="replace") for i in order],
            [files[i][1] for i in order])


# ---- parallel text (Multi30k) --------------------------------------------------------------

class Multi30k(_TextFolder):
    name: Literal["multi30k"] = "multi30k"
    folder: str = "multi30k"
    source_lang: str = "de"  # file suffix of the source side
    target_lang: str = "en"
    val_split: str = "val"  # file stem of the validation split
    max_len: conint(ge=3) = 64  # positions per side, <sos> and <eos> included (longer: truncated)
    min_freq: PositiveInt = 2
    max_vocab: Optional[conint(ge=len(SPECIALS) + 1)] = None  # per language, specials included

    def expected(self) -> tuple[list[str], str]:
        names = [f"{split}.{lang}" for split in ("train", self.val_split) for lang in (self.source_lang, self.target_lang)]
        return names, f"parallel text files {', '.join(names)}, one sentence per line"

    def factory(self):
        return load_parallel


def load_parallel(*, root: str, folder: str, source_lang: str, target_lang: str, val_split: str,
                  max_len: int, min_freq: int, max_vocab: int | None):
    opts = Multi30k(root=root, folder=folder, source_lang=source_lang, target_lang=target_lang, val_split=val_split)
    opts.check_available()
    where = opts.directory()
    splits = {split: [_lines(where / f"{split}.{lang}") for lang in (source_lang, target_lang)]
              for split in ("train", val_split)}
    for split, (src, tgt) in splits.items():
        if len(src) != len(tgt):
            raise SuiteError(f"data set multi30k: {where / f'{split}.{source_lang}'} has {len(src)} lines but "
                             f"{split}.{target_lang} has {len(tgt)}; the two sides of a split must pair line by line")
    tokens = {split: [[tokenize(line) for line in side] for side in sides] for split, sides in splits.items()}
    vocabs = [Vocab.build(side, min_freq, max_vocab) for side in tokens["train"]]  # training split only
    sets = []
    for split in ("train", val_split):
        src, tgt = ([v.encode(t) for t in side] for v, side in zip(vocabs, tokens[split]))
        sets.append(TensorDataset(*pack_pairs(src, tgt, max_len)))
    spec = DataSpec("multi30k", (2, max_len), len(vocabs[1]), "int64", max_len, input_vocab=len(vocabs[0]))
    return sets[0], sets[1], spec


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


OPTIONS = [Imdb, Multi30k]
