import copy
import os
import threading
import time

import numpy as np
import pytest
import torch

from distrec.components.optim import make_optimizers
from distrec.components.step import TrainStep
from distrec.data.batch import Batch
from distrec.hotline.access_logger import AccessLogger
from distrec.hotline.embedding import HotlineEmbeddingBagCollection
from distrec.hotline.hot_set import HotSet
from distrec.hotline.optim import TieredRowOptimizer
from distrec.hotline.pipeline import WORKER_NAME, HotlinePipeline
from distrec.hotline.placement import ThreadPlacement
from test_hotline_embedding import TABLES, all_rows, tiny_dlrm, zipf_batch


@pytest.mark.parametrize("optimizer, lr", [("sgd", 0.1), ("adagrad", 0.1), ("adam", 0.01)])
def test_training_equals_ordinary_training(tmp_path, optimizer, lr):
    model = tiny_dlrm()
    hot_model = copy.deepcopy(model)
    hot_model.embeddings = HotlineEmbeddingBagCollection.from_embedding_bags(model.embeddings, optimizer=optimizer, slow="disk", directory=tmp_path)
    baseline = TrainStep(model, make_optimizers(model, optimizer, lr))
    hotline = TrainStep(hot_model, [*make_optimizers(hot_model, optimizer, lr), TieredRowOptimizer(hot_model.embeddings, lr=lr)])
    budget = 30 * hot_model.embeddings.hot_row_bytes
    rng = np.random.default_rng(0)
    with HotlinePipeline(hot_model.embeddings, AccessLogger(4096, sample_rate=1.0), budget, relearn_every=2) as pipe:
        for _ in range(7):
            batch = zipf_batch(rng, 32)
            expected = baseline(batch)
            loss = pipe.run(batch, hotline.backward)
            hotline.apply()
            assert abs(float(loss) - float(expected)) < 1e-6
        assert pipe.stats.relearns == 3
        assert 0 < pipe.stats.popular_samples < pipe.stats.samples  # both micro-batches ran
    assert 0 < hot_model.embeddings.hot_ids.numel() <= 30
    torch.testing.assert_close(all_rows(hot_model.embeddings), model.embeddings.weight.detach(), rtol=0, atol=1e-6)
    dense = {name: p for name, p in model.named_parameters() if not name.startswith("embeddings.")}
    hot_params = dict(hot_model.named_parameters())
    assert hot_params.keys() == dense.keys()
    for name, p in dense.items():
        torch.testing.assert_close(hot_params[name], p, rtol=0, atol=1e-6)
    hot_model.embeddings.close()
    assert list(tmp_path.iterdir()) == []


def test_relearning_follows_drifting_popularity():
    ebc = HotlineEmbeddingBagCollection(TABLES, slow="host")
    rng = np.random.default_rng(3)

    def backward(micro: Batch, normalizer: float) -> torch.Tensor:
        loss = ebc(micro).sum() / normalizer
        loss.backward()
        return loss.detach()

    def popular_fraction(pipe: HotlinePipeline, shift: int, steps: int) -> float:
        before = copy.copy(pipe.stats)
        for _ in range(steps):
            pipe.run(zipf_batch(rng, 64, shift), backward)
            ebc.clear_gradients()
        return (pipe.stats.popular_samples - before.popular_samples) / (pipe.stats.samples - before.samples)

    with HotlinePipeline(ebc, AccessLogger(4096, sample_rate=1.0), 40 * ebc.hot_row_bytes, relearn_every=4) as pipe:
        assert popular_fraction(pipe, 0, 4) == 0.0  # learning: nothing is hot yet
        settled = popular_fraction(pipe, 0, 4)
        assert settled > 0.3
        assert popular_fraction(pipe, 20, 4) < settled / 2  # popularity moved; the old hot set misses it
        assert popular_fraction(pipe, 20, 4) > 0.3  # one relearn period later it is followed again
        assert pipe.stats.relearns == 3


def live_workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(WORKER_NAME)]


def pipeline_with_hot_rows(tmp_path) -> tuple[HotlinePipeline, HotlineEmbeddingBagCollection]:
    ebc = HotlineEmbeddingBagCollection(TABLES, slow="disk", directory=tmp_path)
    hot = HotSet.from_global_ids(np.r_[0:5, 40:45, 65:70], ebc.space, 0)
    return HotlinePipeline(ebc, AccessLogger(4096), 0, relearn_every=0, hot_set=hot), ebc


def test_an_error_in_the_worker_surfaces_and_the_pipeline_shuts_down(tmp_path):
    pipe, ebc = pipeline_with_hot_rows(tmp_path)
    gather = ebc.store.gather_staged

    def failing_in_worker(ids, width=None, slots=None):
        if threading.current_thread().name.startswith(WORKER_NAME):
            raise OSError("slow tier read failed")
        return gather(ids, width, slots)

    ebc.store.gather_staged = failing_in_worker
    batch = zipf_batch(np.random.default_rng(4), 64)
    with pytest.raises(OSError, match="slow tier read failed"):
        pipe.run(batch, lambda micro, n: ebc(micro).sum().backward() or torch.zeros(()))
    assert live_workers()
    pipe.close()
    assert live_workers() == []
    assert ebc.apply_gradients(lambda rows, grads: None) is False  # the failed step's gradients are gone
    ebc.close()
    assert list(tmp_path.iterdir()) == []


def test_an_error_in_the_caller_waits_for_the_worker(tmp_path):
    pipe, ebc = pipeline_with_hot_rows(tmp_path)
    gather = ebc.store.gather_staged
    worker_done = threading.Event()

    def slow_in_worker(ids, width=None, slots=None):
        if threading.current_thread().name.startswith(WORKER_NAME):
            time.sleep(0.2)
            worker_done.set()
        return gather(ids, width, slots)

    def failing_backward(micro, normalizer):
        raise RuntimeError("loss is NaN")

    ebc.store.gather_staged = slow_in_worker
    with pipe, pytest.raises(RuntimeError, match="NaN"):
        pipe.run(zipf_batch(np.random.default_rng(5), 64), failing_backward)
    assert worker_done.is_set()
    assert live_workers() == []
    ebc.close()


def test_a_placement_pins_the_step_and_the_worker(tmp_path):
    allowed = frozenset(os.sched_getaffinity(0))
    placement = ThreadPlacement(compute=frozenset({min(allowed)}), prefetch=frozenset({max(allowed)}))
    ebc = HotlineEmbeddingBagCollection(TABLES, slow="disk", directory=tmp_path)
    hot = HotSet.from_global_ids(np.r_[0:5, 40:45, 65:70], ebc.space, 0)
    seen: dict[str, set[frozenset[int]]] = {"step": set(), "worker": set()}
    gather = ebc.store.gather_staged

    def gather_noting_cpus(ids, width=None, slots=None):
        if threading.current_thread().name.startswith(WORKER_NAME):
            seen["worker"].add(frozenset(os.sched_getaffinity(0)))
        return gather(ids, width, slots)

    def backward(micro: Batch, normalizer: float) -> torch.Tensor:
        seen["step"].add(frozenset(os.sched_getaffinity(0)))
        loss = ebc(micro).sum() / normalizer
        loss.backward()
        return loss.detach()

    ebc.store.gather_staged = gather_noting_cpus
    with HotlinePipeline(ebc, AccessLogger(4096), 0, relearn_every=0, hot_set=hot, placement=placement) as pipe:
        for seed in range(3):
            pipe.run(zipf_batch(np.random.default_rng(seed), 64), backward)
            ebc.clear_gradients()
        assert 0 < pipe.stats.popular_samples < pipe.stats.samples  # the worker gathered
    assert seen == {"step": {placement.compute}, "worker": {placement.prefetch}}
    assert os.sched_getaffinity(0) == allowed
    ebc.close()
