"""A trained model as one ``torch.export`` program: jagged inputs in, click probabilities out."""

from __future__ import annotations

import torch
from torch import nn
from torch.export import ExportedProgram

from distrec.models.base import RecommendationModel
from distrec.serving.inputs import JaggedInputs, dynamic_shapes, example_inputs


class ServingModel(nn.Module):
    """``(dense, values, lengths) -> `` click probabilities float32 [B] (the sigmoid of
    ``model``'s logits), in the signature of ``distrec.serving.inputs``.

    ``model`` must pool its embeddings in torch operators (``distrec.serving.lookup.use_serving_tables``)
    to be exported; any model scores alike.
    """

    def __init__(self, model: RecommendationModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.model(JaggedInputs(dense, values, lengths).batch()))


def export_program(model: RecommendationModel, num_dense: int, table_rows: list[int]) -> ExportedProgram:
    """``ServingModel(model)`` traced by ``torch.export`` for any batch size (its parameters
    frozen: the program computes no gradients), for tables of ``table_rows`` rows."""
    serving = ServingModel(model).eval().requires_grad_(False)
    with torch.no_grad():
        return torch.export.export(serving, tuple(example_inputs(num_dense, table_rows)), dynamic_shapes=dynamic_shapes(len(table_rows)), strict=False)
