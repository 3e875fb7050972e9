"""The embedding optimizer of Hotline: the project's sparse row updates, applied tier by tier.

``distrec.components.optim`` defines the sparse optimizers (SGD, row-wise Adagrad, lazy Adam)
for a table-sized parameter with table-sized state. In Hotline a row and its optimizer
state live together in one stored row of the fast or the slow tier (see ``tiers.py``), so
this optimizer runs the very same ``update`` of the project's optimizer on each tier, with
weights and state as column views of the stored rows: in place on the fast tier (indexed by
slot), and on a gathered copy of the touched slow-tier rows, written back. Same formula, so
the trained model equals ordinary training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.optim import Optimizer

from distrec.components.optim import SPARSE_OPTIMIZERS, evaluate_closure
from distrec.errors import DistrecError
from distrec.hotline.row_state import STEP_KEY, state_views

if TYPE_CHECKING:
    from distrec.hotline.embedding import HotlineEmbeddingBagCollection


class TieredRowOptimizer(Optimizer):
    """Steps the rows a HotlineEmbeddingBagCollection looked up, each in its own tier.

    A torch ``Optimizer`` with one parameter group and no parameters, so learning-rate
    schedulers drive its ``lr`` and trainers step it beside the dense optimizer. The
    optimizer kind is the module's (``embeddings.optimizer``), fixed when its rows were
    laid out; ``hyper`` are that optimizer's settings (``lr``, ``eps``, ``betas``).

    Example:
        >>> ebc = HotlineEmbeddingBagCollection(tables, optimizer="adagrad")
        >>> opt = TieredRowOptimizer(ebc, lr=0.01)
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, embeddings: HotlineEmbeddingBagCollection, **hyper: object) -> None:
        self.embeddings = embeddings
        self._rule = SPARSE_OPTIMIZERS[embeddings.optimizer]([{"params": []}], **hyper)
        if self._rule.defaults.get("initial_accumulator_value", 0.0) != 0.0:
            raise DistrecError("Hotline embeddings start their optimizer state at 0; leave initial_accumulator_value unset")
        super().__init__([{"params": []}], self._rule.defaults)

    @torch.no_grad()
    def step(self, closure=None):
        loss = evaluate_closure(closure)
        group = self.param_groups[0]
        steps = self.state.get(STEP_KEY, 0)
        if self.embeddings.apply_gradients(lambda rows, grads: self._update(rows, grads, group, steps)):
            self.state[STEP_KEY] = steps + 1
        return loss

    def _update(self, rows: torch.Tensor, grad: torch.Tensor, group: dict, steps: int) -> None:
        """Run the project optimizer's update in place on stored rows [n, width] (a gathered
        copy, or the whole fast tier) from their sparse gradient [n, dim]."""
        dim = grad.shape[1]
        state = state_views(rows, self.embeddings.optimizer, dim)
        state[STEP_KEY] = steps
        self._rule.update(rows[:, :dim], grad, group, state)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients of the rows looked up since the last step."""
        self.embeddings.clear_gradients()
