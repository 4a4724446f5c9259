"""Held-out check of the time model on model sizes and batches no benchmark uses: the predict
section of compare.py (its calibration, runs and targets) with its families swapped for five
others (an MLP 1024-256-256 at batch 128, the CNN at batch 32, a 3-layer transformer of width 96,
VGG-11 at width 1/8, a GRU seq2seq) and its strategies cut to ddp, allreduce, fsdp, ZeRO-2/3,
tensor and GPipe at world 2 and 4, HSDP and pipeline x dp at 4: 73 runs, about 15 min on 2 cores.

    python benchmarks/predict_sizes.py OUT    (then benchmarks/repredict.py OUT re-predicts them)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare  # noqa: E402
import sections.predict as predict  # noqa: E402

IMAGES = "{name: synthetic, shape: [3, 32, 32], classes: 10, n_train: 4096, n_val: 64}"
predict.FAMILIES = {
    "mlpwide": ("{name: mlp, hidden: [1024, 256, 256]}",
                "{name: synthetic, shape: [1, 28, 28], classes: 10, n_train: 8192, n_val: 64}", 128),
    "cnnb32": ("{name: cnn}", IMAGES, 32),
    "transformer3": ("{name: transformer, dim: 96, heads: 4, layers: 3}",
                     "{name: synthetic_tokens, vocab: 128, seq_len: 48, branching: 4, n_train: 4096, n_val: 64}", 16),
    "vgg11w": ("{name: vgg11, width: 0.125, classifier_hidden: 256}", IMAGES, 32),
    "seq2seqgru": ("{name: seq2seq, cell: gru, layers: 1, embedding: 48, hidden: 128, dropout: 0.0}",
                   "{name: synthetic_seq2seq, task: reverse, vocab: 20, n_train: 4096, n_val: 64}", 32),
}
predict.DATA_PARALLEL = {k: v for k, v in predict.DATA_PARALLEL.items() if k in ("ddp", "allreduce", "fsdp", "zero2", "zero3")}
predict.MODEL_PARALLEL = {k: v for k, v in predict.MODEL_PARALLEL.items() if k in ("tensor", "gpipe")}
predict.HYBRID = {k: v for k, v in predict.HYBRID.items() if k in ("hsdp", "pipeline_dp")}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    sys.exit(compare.main(["--only", "predict", "--out", sys.argv[1]]))
