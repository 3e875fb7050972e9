"""A vector on the stack for numba kernels, so that a row's running sum stays in registers.

A kernel that adds rows into a heap array (``np.empty(dim)``) reads and writes that array at
every row: the compiler cannot prove that it is not the table being read, and a run-time
``dim`` keeps it from unrolling the loop over the row. A stack array of a size fixed at
compile time is neither, so a 64-float sum lives in eight vector registers while a bag's rows
are added (as in FBGEMM's generated kernels). Kernels get the size as a constant from a
factory closing over it (``distrec.kernels.bags``, ``distrec.kernels.row_updates``).
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def stack_vector(typingctx, size, like):  # pragma: no cover - compiled
    """A [size] array of ``like``'s dtype (an array) in the calling function's stack frame
    (uninitialised); ``size`` must be a compile-time constant. Valid until that function
    returns: never return it."""
    if not isinstance(size, types.IntegerLiteral) or not isinstance(like, types.Array):
        return None
    vector = types.Array(like.dtype, 1, "C")

    def codegen(context, builder, signature, args):
        count = context.get_constant(types.intp, size.literal_value)
        element = context.get_value_type(like.dtype)
        data = cgutils.alloca_once(builder, element, size=count)
        itemsize = context.get_constant(types.intp, context.get_abi_sizeof(element))
        array = context.make_array(vector)(context, builder)
        context.populate_array(array, data=data, shape=[count], strides=[itemsize], itemsize=itemsize, meminfo=None)
        return array._getvalue()

    return vector(size, like), codegen
