"""Weight averaging (Mogrifier paper section 3.3; docs/method.md "Training recipe").

Once validation has not improved for N evaluations, or at a fraction of training at the latest, a
uniform running average of the weights is kept after every step. Evaluation and best-checkpoint
selection use the averaged weights while training continues on the raw ones. The average is
torch.optim.swa_utils.AveragedModel's uniform one.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel


class WeightAverage:
    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.averaged: AveragedModel | None = None
        self.since_step: int | None = None

    @property
    def active(self) -> bool:
        return self.averaged is not None

    def start(self, step: int) -> None:
        """Begin averaging; the first :meth:`update` copies the current weights."""
        if self.averaged is None:
            self.averaged = AveragedModel(self.model, use_buffers=False)
            self.since_step = step

    def update(self) -> None:
        if self.averaged is not None:
            self.averaged.update_parameters(self.model)

    def evaluation_model(self) -> nn.Module:
        """The module whose weights are evaluated: the average when active, else the raw model."""
        return self.model if self.averaged is None else self.averaged.module

    @property
    def count(self) -> int:
        """How many weight vectors are in the average."""
        return 0 if self.averaged is None else int(self.averaged.n_averaged)

    def weights(self) -> dict[str, Tensor]:
        """The averaged weights, as a state dict of the model."""
        return {} if self.averaged is None else dict(self.averaged.module.state_dict())

    def load(self, weights: dict[str, Tensor], count: int, since_step: int) -> None:
        self.start(since_step)
        self.averaged.module.load_state_dict(weights)
        with torch.no_grad():
            self.averaged.n_averaged.fill_(count)
