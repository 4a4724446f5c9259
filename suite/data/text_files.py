"""Text as users hold it: a tokenizer saved in a local folder and documents in local files,
tokenized and cut into sequences of ``seq_len`` next-token samples.

```yaml
data: {name: text_files, tokenizer: ./my-tokenizer, train: ./train.jsonl, val: ./val.jsonl, seq_len: 128}
```

- ``tokenizer``: a folder ``save_pretrained`` wrote (``tokenizer.json`` and its config; any
  tokenizer ``transformers.AutoTokenizer`` loads from a folder, no hub access).
- ``train`` / ``val``: a file or a glob of files: ``.jsonl`` (one JSON object per line, the text
  under ``field``), ``.txt`` (one document per non-empty line) or ``.parquet`` (the ``field``
  column; needs pyarrow).
- ``pack: true`` (default): the documents are concatenated, each followed by the tokenizer's
  end-of-sequence token, and cut into windows of ``seq_len + 1`` tokens: a sample's inputs are
  a window's first ``seq_len``, its targets the last ``seq_len`` (the next tokens); only the last
  window can fall short, and is padded. ``pack: false``: each document is a sample of its own,
  truncated, and padded to ``seq_len``.
- Padding: the inputs hold the tokenizer's pad id (else its end-of-sequence id, else 0), and the
  targets there hold ``suite.data.IGNORE``, which the loss, accuracy and perplexity skip; a model
  whose config names that pad id (``pad_token_id``) also hides it from attention
  (``suite.models.hf``). The vocabulary (``DataSpec.num_classes``) is the tokenizer's.
"""
from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Literal

import torch
from pydantic import PositiveInt, PrivateAttr, conint
from torch.utils.data import TensorDataset

from suite.common.errors import SuiteError
from suite.data import IGNORE, DataSpec
from suite.data.base import DataOptions

_KINDS = (".jsonl", ".txt", ".parquet")


class TextFiles(DataOptions):
    name: Literal["text_files"] = "text_files"
    tokenizer: str  # a folder save_pretrained wrote
    train: str  # a file or a glob: .jsonl, .txt or .parquet
    val: str
    seq_len: conint(ge=2) = 128
    field: str = "text"  # the text's key in .jsonl objects, its column in .parquet
    pack: bool = True
    _loaded = PrivateAttr(default=None)

    def loaded(self):
        if self._loaded is None:
            self._loaded = super().loaded()
        return self._loaded

    def sizes(self):
        self.check_available()
        train, val, _ = self.loaded()
        return len(train), len(val)

    def check_available(self) -> None:
        if not Path(self.tokenizer, "tokenizer_config.json").is_file() and not Path(self.tokenizer, "tokenizer.json").is_file():
            raise SuiteError(f"data.tokenizer={self.tokenizer!r} holds no tokenizer.json or tokenizer_config.json; "
                             f"give the folder a tokenizer's save_pretrained wrote")
        for key in ("train", "val"):
            files(getattr(self, key), key)


def files(pattern: str, key: str) -> list[str]:
    """The files ``data.<key>`` names, sorted; SuiteError when none, or one of a kind not read."""
    found = sorted(glob.glob(pattern)) if any(c in pattern for c in "*?[") else ([pattern] if Path(pattern).is_file() else [])
    if not found:
        raise SuiteError(f"data.{key}={pattern!r} names no file; give a .jsonl, .txt or .parquet file or a glob of them")
    odd = [f for f in found if Path(f).suffix not in _KINDS]
    if odd:
        raise SuiteError(f"data.{key}: {odd[0]} is not one of {', '.join(_KINDS)}; convert it, or leave it out of the glob")
    return found


def documents(paths: list[str], field: str, key: str) -> list[str]:
    """Every document of the files, in order."""
    out = []
    for path in paths:
        suffix = Path(path).suffix
        if suffix == ".txt":
            out += [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        elif suffix == ".jsonl":
            for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    out.append(_field(json.loads(line), field, f"{path}:{number}"))
        else:
            out += _parquet(path, field, key)
    return out


def _field(record: dict, field: str, where: str) -> str:
    if not isinstance(record, dict) or not isinstance(record.get(field), str):
        raise SuiteError(f"{where} has no text under {field!r}; set data.field to the key that holds the text")
    return record[field]


def _parquet(path: str, field: str, key: str) -> list[str]:
    try:
        import pyarrow.parquet as pq  # optional: only .parquet files need it
    except ImportError:
        raise SuiteError(f"data.{key}: reading {path} needs pyarrow; pip install pyarrow, or give .jsonl") from None
    table = pq.read_table(path)
    if field not in table.column_names:
        raise SuiteError(f"{path} has no column {field!r} (it has {', '.join(table.column_names)}); set data.field")
    return [str(v) for v in table.column(field).to_pylist() if v]


def load_tokenizer(folder: str):
    from transformers import AutoTokenizer  # optional: transformers only for data sets that tokenize

    return AutoTokenizer.from_pretrained(folder)


def pad_id(tokenizer) -> int:
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def samples(token_lists: list[list[int]], seq_len: int, pad: int, eos: int | None, pack: bool):
    """(inputs, targets), each (samples, seq_len) int64; see the module doc."""
    if pack:
        stream = [t for tokens in token_lists for t in [*tokens, *([eos] if eos is not None else [])]]
        windows = [stream[i:i + seq_len + 1] for i in range(0, max(len(stream) - 1, 0), seq_len)]
    else:
        windows = [tokens[:seq_len + 1] for tokens in token_lists if len(tokens) > 1]
    inputs = torch.full((len(windows), seq_len), pad, dtype=torch.int64)
    targets = torch.full((len(windows), seq_len), IGNORE, dtype=torch.int64)
    for i, window in enumerate(windows):
        n = len(window) - 1
        inputs[i, :n] = torch.tensor(window[:-1])
        targets[i, :n] = torch.tensor(window[1:])
    return inputs, targets


def load(*, tokenizer: str, train: str, val: str, seq_len: int, field: str, pack: bool):
    tok = load_tokenizer(tokenizer)
    pad, eos = pad_id(tok), tok.eos_token_id
    sets = []
    for key, pattern in (("train", train), ("val", val)):
        texts = documents(files(pattern, key), field, key)
        ids = tok(texts, add_special_tokens=False)["input_ids"] if texts else []
        inputs, targets = samples(ids, seq_len, pad, eos, pack)
        if not len(inputs):
            raise SuiteError(f"data.{key}={pattern!r} gives no sample of two tokens or more; give more text")
        sets.append(TensorDataset(inputs, targets))
    vocab = len(tok)
    spec = DataSpec("text_files", (seq_len,), vocab, "int64", seq_len, input_vocab=vocab)
    return sets[0], sets[1], spec


OPTIONS = [TextFiles]
