"""What a model's output is scored against: the loss and, where it applies, accuracy (and, for
segmentation, the per-class sums mean IoU is computed from; for language, perplexity)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from suite.data import IGNORE
from suite.record import metrics


class Task:
    has_accuracy = True

    def __init__(self, kind: str, num_classes: int = 0):
        self.kind = kind
        self.has_accuracy = kind != "reconstruction"
        self.num_classes = num_classes  # segmentation: classes of the masks (per-class IoU sums)
        # language with model.loss=model: the model's own loss, fn(logits, next-token targets)
        # (suite.models.hf.loss_function); the run record names which loss trained (``loss_name``)
        self.model_loss = None
        self.loss_name = {"reconstruction": "task: mean squared error against the input",
                          "language": "task: per-token cross-entropy, mean per sequence, then over sequences",
                          }.get(kind, "task: cross-entropy")

    def use_model_loss(self, loss, name: str) -> None:
        """Train on the model's own loss instead (evaluation still sums token losses: val_loss is
        the mean token loss either way)."""
        self.model_loss, self.loss_name = loss, f"model: {name}"

    @property
    def eval_size(self) -> int:
        """Length of the vector ``evaluate`` returns (every rank must reduce the same shape)."""
        return 3 + (2 * self.num_classes if self.kind == "segmentation" else 0)

    def loss(self, output, inputs, targets) -> torch.Tensor:
        if self.kind == "reconstruction":
            return F.mse_loss(_upcast(output), inputs)
        if self.kind == "language" and self.model_loss is not None:
            return self.model_loss(output, targets)
        if self.kind == "language":
            # Each sequence weighs the same: the mean over sequences of each one's mean token loss.
            # A mean over samples is what data-parallel ranks can average (equal shards) and
            # pipelines split into micro-batches exactly; a mean over the batch's scored tokens
            # would weigh each rank's tokens by its own count and train unlike one process.
            losses, scored = _token_losses(output, targets)
            return (losses.sum(1) / scored.sum(1).clamp(min=1)).mean()
        # classification: (batch, classes) vs (batch,); segmentation: (batch, classes, H, W) vs
        # (batch, H, W), the mean over every pixel.
        return F.cross_entropy(_upcast(output), targets)

    def predicted(self, output) -> torch.Tensor:
        """Class ids: the argmax over the class dimension (dim 1 for segmentation maps)."""
        return output.argmax(1 if self.kind == "segmentation" else -1)

    @torch.no_grad()
    def correct(self, output, targets) -> torch.Tensor:
        if not self.has_accuracy:
            return torch.zeros((), device=output.device)
        right = (self.predicted(output) == targets).float()
        if self.kind == "language" and self.model_loss is not None:
            return self.model_loss(output, targets)
        if self.kind == "language":
            # Each sequence counts as one sample scored by its fraction of right scored tokens
            # (targets IGNORE are not scored), as in the training loss.
            scored = (targets != IGNORE).float()
            return ((right * scored).flatten(1).sum(1) / scored.flatten(1).sum(1).clamp(min=1)).sum()
        # Segmentation: each sample counts as one, scored by its fraction of right pixels, so
        # correct / samples is pixel accuracy in training steps and in evaluation alike.
        return right.flatten(1).mean(1).sum() if self.kind == "segmentation" else right.sum()

    @torch.no_grad()
    def evaluate(self, output, inputs, targets) -> torch.Tensor:
        """[loss_sum, correct, count] (segmentation: then each class's intersection and union
        pixel counts), summed so that ranks can add theirs. Language counts scored tokens: the
        loss is then the mean token loss over the whole set (its exp the perplexity) and the
        accuracy token accuracy, whatever the batches and sequence lengths."""
        if self.kind == "language":
            losses, scored = _token_losses(output, targets)
            right = (output.argmax(-1) == targets).float() * scored
            return torch.stack([losses.sum(), right.sum(), scored.sum()])
        count = len(inputs)
        loss_sum = _upcast(self.loss(output, inputs, targets)) * count
        count_t = torch.tensor(float(count), device=output.device)
        sums = torch.stack([loss_sum, self.correct(output, targets), count_t])
        if self.kind != "segmentation":
            return sums
        # Pixel counts pass 2**24 (float32's exact integers) within a few hundred images: float64.
        inter, union = metrics.intersection_union(self.predicted(output), targets, self.num_classes)
        return torch.cat([sums.double(), inter.double(), union.double()])

    def eval_results(self, sums: list[float]) -> dict:
        """What evaluation adds beyond val_loss / val_accuracy, from the reduced ``evaluate`` sums."""
        loss_sum, _, count = sums[:3]
        if self.kind == "language" and count:
            return {"val_perplexity": metrics.perplexity(loss_sum / count)}
        if self.kind != "segmentation":
            return {}
        c = self.num_classes
        return {"val_miou": metrics.mean_iou(sums[3:3 + c], sums[3 + c:3 + 2 * c])}


def _upcast(output: torch.Tensor) -> torch.Tensor:
    """Losses in at least float32 (autocast's bf16/fp16 outputs go up); float64 (fp64) stays."""
    return output if output.dtype in (torch.float32, torch.float64) else output.float()


def _token_losses(output, targets):
    """(per-token losses, 1.0 where scored), both (batch, length); unscored tokens lose 0."""
    losses = F.cross_entropy(_upcast(output).flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="none")
    return losses.view(targets.shape), (targets != IGNORE).float()
