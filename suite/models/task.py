"""What a model's output is scored against: the loss and, where it applies, accuracy."""
from __future__ import annotations

import torch
import torch.nn.functional as F


class Task:
    has_accuracy = True

    def __init__(self, kind: str):
        self.kind = kind
        self.has_accuracy = kind != "reconstruction"

    def loss(self, output, inputs, targets) -> torch.Tensor:
        if self.kind == "reconstruction":
            return F.mse_loss(output.float(), inputs)
        if self.kind == "language":
            return F.cross_entropy(output.float().flatten(0, 1), targets.flatten())
        return F.cross_entropy(output.float(), targets)

    @torch.no_grad()
    def correct(self, output, targets) -> torch.Tensor:
        if not self.has_accuracy:
            return torch.zeros((), device=output.device)
        right = (output.argmax(-1) == targets).float()
        # Language: each sequence counts as one sample scored by its fraction of right tokens,
        # so correct / samples is token accuracy both in training steps and in evaluation.
        return right.flatten(1).mean(1).sum() if self.kind == "language" else right.sum()

    @torch.no_grad()
    def evaluate(self, output, inputs, targets) -> torch.Tensor:
        """[loss_sum, correct, count], summed so that ranks can add theirs."""
        count = len(inputs)
        loss_sum = self.loss(output, inputs, targets).float() * count
        count_t = torch.tensor(float(count), device=output.device)
        return torch.stack([loss_sum, self.correct(output, targets), count_t])
