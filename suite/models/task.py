"""What a model's output is scored against: the loss and, where it applies, accuracy."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from suite.data import IGNORE


class Task:
    has_accuracy = True

    def __init__(self, kind: str):
        self.kind = kind
        self.has_accuracy = kind != "reconstruction"
        self.has_perplexity = kind == "language"

    def loss(self, output, inputs, targets) -> torch.Tensor:
        if self.kind == "reconstruction":
            return F.mse_loss(output.float(), inputs)
        if self.kind == "language":
            # Each sequence weighs the same: the mean over sequences of each one's mean token loss.
            # A mean over samples is what data-parallel ranks can average (equal shards) and
            # pipelines split into micro-batches exactly; a mean over the batch's scored tokens
            # would weigh each rank's tokens by its own count and train unlike one process.
            losses, scored = _token_losses(output, targets)
            return (losses.sum(1) / scored.sum(1).clamp(min=1)).mean()
        return F.cross_entropy(output.float(), targets)

    @torch.no_grad()
    def correct(self, output, targets) -> torch.Tensor:
        if not self.has_accuracy:
            return torch.zeros((), device=output.device)
        right = (output.argmax(-1) == targets).float()
        if self.kind != "language":
            return right.sum()
        # Each sequence counts as one sample scored by its fraction of right scored tokens
        # (targets IGNORE are not scored), as in the training loss.
        scored = (targets != IGNORE).float()
        return ((right * scored).flatten(1).sum(1) / scored.flatten(1).sum(1).clamp(min=1)).sum()

    @torch.no_grad()
    def evaluate(self, output, inputs, targets) -> torch.Tensor:
        """[loss_sum, correct, count], summed so that ranks can add theirs. Language counts scored
        tokens: the loss is then the mean token loss over the whole set (its exp the perplexity)
        and the accuracy token accuracy, whatever the batches and sequence lengths."""
        if self.kind == "language":
            losses, scored = _token_losses(output, targets)
            right = (output.argmax(-1) == targets).float() * scored
            return torch.stack([losses.sum(), right.sum(), scored.sum()])
        count = len(inputs)
        loss_sum = self.loss(output, inputs, targets).float() * count
        count_t = torch.tensor(float(count), device=output.device)
        return torch.stack([loss_sum, self.correct(output, targets), count_t])


def _token_losses(output, targets):
    """(per-token losses, 1.0 where scored), both (batch, length); unscored tokens lose 0."""
    losses = F.cross_entropy(output.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="none")
    return losses.view(targets.shape), (targets != IGNORE).float()
