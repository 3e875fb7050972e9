"""Multi-layer perceptrons with ReLU, initialised as in the DLRM reference code."""

from __future__ import annotations

import torch
from torch import nn


def mlp(widths: list[int], final_activation: bool = False, device: torch.device | str | None = None) -> nn.Sequential:
    """Linear layers ``widths[0] -> widths[1] -> ... -> widths[-1]`` with ReLU between them.

    Weights are drawn from N(0, 2 / (fan_in + fan_out)) and biases from N(0, 1 / fan_out),
    the initialisation of the DLRM reference code (Naumov et al., 2019).

    Args:
        widths: layer widths including the input width; ``[n]`` gives an identity.
        final_activation: also apply ReLU after the last layer.
        device: where to allocate the parameters.

    Example:
        >>> mlp([13, 512, 256, 64], final_activation=True)   # DLRM's bottom MLP
    """
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        linear = nn.Linear(fan_in, fan_out, device=device)
        with torch.no_grad():
            linear.weight.normal_(0.0, (2.0 / (fan_in + fan_out)) ** 0.5)
            linear.bias.normal_(0.0, (1.0 / fan_out) ** 0.5)
        layers.append(linear)
        if final_activation or i < len(widths) - 2:
            # in place is safe: a Linear does not need its output for its own backward
            layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)
