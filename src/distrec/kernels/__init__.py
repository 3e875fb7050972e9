"""Building blocks of the embedding hot path: torch operators, and numba-compiled row updates for CPU weights."""
