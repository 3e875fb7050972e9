"""Pure-PyTorch building blocks of the embedding hot path (no compiled extension)."""
