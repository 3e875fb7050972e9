"""Producing the items of an iterator ahead of time on a background thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

_POLL_S = 0.05  # how often a producer blocked on a full queue checks for a stop request


class _End:
    """Marks the end of the stream; carries the producer's exception, if any."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def prefetch(items: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Yield the items of ``items``, computed up to ``depth`` ahead on a background thread.

    An exception in the producer is re-raised in the consumer. If the consumer stops early
    (breaks out of its loop or drops the iterator), the producer stops after at most the
    item it is computing and the thread is joined: no thread outlives the iteration.
    """
    buffer: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                buffer.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_End())
        except BaseException as e:  # handed to the consumer
            put(_End(e))

    worker = threading.Thread(target=produce, name="distrec-prefetch", daemon=True)
    worker.start()
    try:
        while True:
            item = buffer.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        stop.set()
        worker.join()
