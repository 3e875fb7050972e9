"""Computing the items of a sequence ahead of time on background threads, yielded in order."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import TypeVar

A = TypeVar("A")
T = TypeVar("T")

THREAD_NAME = "distrec-prefetch"


def prefetch(make: Callable[[A], T], args: Iterable[A], depth: int = 2, threads: int = 1) -> Iterator[T]:
    """Yield ``make(a)`` for each ``a`` of ``args``, in order, computed up to ``depth`` items
    ahead by ``threads`` background threads (``make`` must release the GIL for them to run at
    once, as NumPy's copies and numba's ``nogil`` kernels do).

    An exception in ``make`` is raised in the consumer at its item. If the consumer stops early
    (breaks out of its loop or drops the iterator), the items not started are dropped, the
    ones being computed finish and the threads are joined: no thread outlives the iteration.
    """
    args = iter(args)
    with ThreadPoolExecutor(max(threads, 1), thread_name_prefix=THREAD_NAME) as pool:
        ahead = deque(pool.submit(make, a) for a in islice(args, max(depth, 1)))
        try:
            while ahead:
                item = ahead.popleft().result()
                ahead.extend(pool.submit(make, a) for a in islice(args, 1))
                yield item
        finally:
            for future in ahead:
                future.cancel()
