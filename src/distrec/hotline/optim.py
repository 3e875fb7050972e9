"""The embedding optimizer of Hotline: the project's sparse row updates, applied tier by tier.

``distrec.components.optim`` defines the sparse optimizers (SGD, row-wise Adagrad, lazy Adam)
for a table-sized parameter with table-sized state. In Hotline a row and its optimizer
state live together in one stored row of the fast or the slow tier (see ``tiers.py``), so
this optimizer runs the very same ``update`` of the project's optimizer on each tier, with
weights and state as column views of the stored rows: in place on the fast tier (indexed by
slot), and on a gathered copy of the touched slow-tier rows, written back. Same formula, so
the trained model equals ordinary training.

Rows of a half table are updated in float32 and rounded stochastically when written, as the
project's optimizer rounds a half parameter: the random stream of a write is keyed by the
tier (``FAST_TIER_KEY``, ``SLOW_TIER_KEY``), the block of rows and the parameter group's
``rounding_steps`` (saved in checkpoints, so a resumed run rounds exactly as the run did).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.optim import Optimizer

from distrec.components.optim import SPARSE_OPTIMIZERS, count_rounding_step, evaluate_closure
from distrec.errors import DistrecError
from distrec.hotline.row_state import STEP_KEY, state_views
from distrec.table_dtype import ROUNDING_KEY

if TYPE_CHECKING:
    from distrec.hotline.embedding import HotlineEmbeddingBagCollection

FAST_TIER_KEY, SLOW_TIER_KEY = 0, 1  # the rounding keys of the writes into each tier


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
            if self.embeddings.layout.dtype != torch.float32:  # rows were rounded
                count_rounding_step(group)
        return loss

    def _update(self, rows: torch.Tensor, grad: torch.Tensor, group: dict, steps: int) -> None:
        """Run the project optimizer's update in place on stored rows [n, width] (a gathered
        copy, or the whole fast tier) from their sparse float32 gradient [n, dim]."""
        layout = self.embeddings.layout
        state = state_views(layout.state(rows), self.embeddings.optimizer, layout.dim)
        state[STEP_KEY] = steps
        weights = layout.weights(rows)
        setattr(weights, ROUNDING_KEY, FAST_TIER_KEY if rows is self.embeddings.store.fast else SLOW_TIER_KEY)
        self._rule.update(weights, grad, group, state)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients of the rows looked up since the last step."""
        self.embeddings.clear_gradients()
