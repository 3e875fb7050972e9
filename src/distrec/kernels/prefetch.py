"""A cache prefetch hint for numba kernels (LLVM's ``llvm.prefetch``).

Gathering or updating rows of a large table in random order is bound by the latency of the
cache misses. Asking for a row a few iterations before it is used keeps several misses in
flight, as FBGEMM's embedding kernels do; the hint never faults and changes no result.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

PREFETCH_DISTANCE = 16
"""Rows ahead that the kernels prefetch (chosen by timing 4 to 32 rows ahead on rows of 64
floats): far enough to keep several misses in flight; a row much further ahead may be
evicted before it is used."""


def _emit_prefetch(builder, pointer) -> None:
    """Emit ``llvm.prefetch`` of ``pointer``: read access, high temporal locality, data cache."""
    byte_pointer = ir.IntType(8).as_pointer()
    hint = ir.FunctionType(ir.VoidType(), [byte_pointer, ir.IntType(32), ir.IntType(32), ir.IntType(32)])
    function = cgutils.get_or_insert_function(builder.module, hint, "llvm.prefetch.p0i8")
    int32 = ir.IntType(32)
    builder.call(function, [builder.bitcast(pointer, byte_pointer), int32(0), int32(3), int32(1)])


@intrinsic
def prefetch(typingctx, array, index):  # pragma: no cover - compiled
    """Hint the CPU to bring ``array[index]`` (a 1-D array) or the start of row ``index`` (2-D) into the cache."""
    if not isinstance(array, types.Array) or array.ndim not in (1, 2):
        return None

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        values = context.make_array(array_type)(context, builder, args[0])
        zero = context.get_constant(types.intp, 0)
        indices = [args[1]] if array_type.ndim == 1 else [args[1], zero]
        pointer = cgutils.get_item_pointer(context, builder, array_type, values, indices)
        _emit_prefetch(builder, pointer)
        return context.get_dummy_value()

    return types.void(array, types.intp), codegen


@intrinsic
def _prefetch_element(typingctx, array, row, column):  # pragma: no cover - compiled
    """Hint the CPU to bring the cache line of ``array[row, column]`` (2-D) into the cache."""
    if not isinstance(array, types.Array) or array.ndim != 2:
        return None

    def codegen(context, builder, signature, args):
        values = context.make_array(signature.args[0])(context, builder, args[0])
        pointer = cgutils.get_item_pointer(context, builder, signature.args[0], values, [args[1], args[2]])
        _emit_prefetch(builder, pointer)
        return context.get_dummy_value()

    return types.void(array, types.intp, types.intp), codegen


CACHE_LINE_BYTES = 64
"""Bytes of a cache line on x86-64 and most ARM cores: the unit one prefetch hint brings in."""


@njit(inline="always")
def prefetch_row(array, row):  # pragma: no cover - compiled
    """Hint the CPU to bring every cache line of row ``row`` of a 2-D array into the cache
    (a 64-float row spans 4 lines): the row update uses it; the pooling, which keeps more rows
    in flight, is faster asking for the first line only (benchmarks/results/2026-11-27-cpu-kernels.md)."""
    step = max(1, CACHE_LINE_BYTES // array.itemsize)
    for column in range(0, array.shape[1], step):
        _prefetch_element(array, row, column)
