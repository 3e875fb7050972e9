"""Training, the same for every parallel mode: the trainer never asks which one it runs.

- the loop: data -> step -> evaluate -> checkpoint -> summary -> ``loop``
- the step (forward, loss, backward, optimizers, schedulers) -> ``step``; optimizers,
  including the sparse row ones (SGD, row-wise Adagrad, lazy Adam) -> ``optim``; learning-rate
  schedules -> ``schedule``
- checkpoints: the component that gathers the parts' state -> ``checkpointer``; the files,
  their atomic writing and reading other ranks' blocks -> ``checkpoint``; random generators
  -> ``rng``
- per-iteration time breakdown (the hybrid-parallel paper's figure) -> ``breakdown``
- metrics and scoring saved models -> ``metrics``, ``evaluate``; the run directory -> ``run``
- the best validation AUC so far and when to stop for lack of progress -> ``early_stopping``;
  TensorBoard event files -> ``tensorboard``
"""
