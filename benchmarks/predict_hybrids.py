"""Held-out check of the time model's hybrids at world 4 (4 ranks on this machine's cores) on five
model variants no other benchmark uses: the predict section of compare.py (its calibration, runs
and targets) with its families swapped for a 4-layer MLP 384 wide, a 2-layer transformer of width
128 (8 heads), an autoencoder of 8 base channels at batch 128, a one-layer LSTM seq2seq 96 wide,
and bag-of-words of width 32; strategies: ddp, fsdp, ZeRO-2, GPipe, HSDP and pipeline x dp (the
last two at world 4 only): 30 runs, about 8 min on 2 cores.

    python benchmarks/predict_hybrids.py OUT    (then benchmarks/repredict.py OUT re-predicts them)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402
import sections.predict as predict  # noqa: E402

predict.FAMILIES = {
    "mlpdeep": ("{name: mlp, hidden: [384, 384, 384, 384]}",
                "{name: synthetic, shape: [1, 28, 28], classes: 10, n_train: 8192, n_val: 64}", 64),
    "transformer8h": ("{name: transformer, dim: 128, heads: 8, layers: 2}",
                      "{name: synthetic_tokens, vocab: 96, seq_len: 24, branching: 4, n_train: 4096, n_val: 64}", 32),
    "autoencoder8": ("{name: autoencoder, base_channels: 8}", "{name: digits}", 128),
    "seq2seq1": ("{name: seq2seq, cell: lstm, layers: 1, embedding: 24, hidden: 96, dropout: 0.0}",
                 "{name: synthetic_seq2seq, task: reverse, vocab: 12, n_train: 4096, n_val: 64}", 64),
    "nbow32": ("{name: nbow, embedding: 32, pooling: mean}",
               "{name: synthetic_sentiment, vocab: 1000, seq_len: 48, min_len: 24, planted: 3, n_train: 8192, n_val: 64}", 64),
}
predict.DATA_PARALLEL = {k: v for k, v in predict.DATA_PARALLEL.items() if k in ("ddp", "fsdp", "zero2")}
predict.MODEL_PARALLEL = {k: v for k, v in predict.MODEL_PARALLEL.items() if k == "gpipe"}
predict.HYBRID = {k: v for k, v in predict.HYBRID.items() if k in ("hsdp", "pipeline_dp")}


def _world_4_only(configs):
    def at_4(bench, slurm):
        return (c for c in configs(bench, slurm) if c[3] == 4)
    return at_4


predict._configs = _world_4_only(predict._configs)

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    sys.exit(compare.main(["--only", "predict", "--out", sys.argv[1]]))
