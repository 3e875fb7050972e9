"""The parts of training that the parallel modes and the trainer both use, below both.

- optimizers, including the sparse row ones (SGD, row-wise Adagrad, lazy Adam) -> ``optim``;
  learning-rate schedules -> ``schedule``
- one training step (forward, loss, backward, gradient sync, optimizers) -> ``step``
- the per-iteration time breakdown (the hybrid-parallel paper's figure) -> ``breakdown``;
  the embedding exchanges' bytes and times -> ``exchange``
- checkpoint files: atomic writing, checksums, safe loading -> ``checkpoint``

Nothing here imports ``distrec.train``, ``distrec.parallel`` or ``distrec.hotline``.
"""
