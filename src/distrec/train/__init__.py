"""Training, the same for every parallel mode: the trainer never asks which one it runs.

- the loop: data -> step -> evaluate -> checkpoint -> summary -> ``loop``
- checkpoints: the component that gathers the parts' state -> ``checkpointer``; random
  generators -> ``rng`` (the files themselves: ``distrec.components.checkpoint``)
- metrics and scoring saved models -> ``metrics``, ``evaluate``; the run directory -> ``run``
- the best validation loss so far and when to stop for lack of progress -> ``early_stopping``;
  TensorBoard event files -> ``tensorboard``

The optimizers, schedules, the step and the time breakdown are ``distrec.components``,
which the parallel modes use too.
"""
