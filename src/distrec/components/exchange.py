"""ExchangeStats: what one forward's embedding exchanges cost this rank (bytes and ms).

Written by the modules that exchange embeddings (``distrec.parallel``, ``distrec.hotline``)
and read by the time breakdown (``distrec.components.breakdown``) and the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExchangeStats:
    """Bytes and milliseconds of the last forward's exchanges on this rank."""

    input_bytes: int = 0
    output_bytes: int = 0
    input_ms: float = 0.0
    lookup_ms: float = 0.0
    output_ms: float = 0.0
