"""all_reduce's buffers as both sides see them: the segment's layout, the ops and the
reduction order (in worker-id order, so that every worker and the controller get the same
bits). No sockets: the controller makes the segments (`platoon._controller.collectives`),
the workers meet in them (`platoon._worker.collectives`)."""

import numpy as np

OPS = ("sum", "mean", "max", "min")
_UFUNCS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}


def check_op(op, dtype):
    """Validate reduction `op` for `dtype`; raises ValueError or TypeError saying what fits."""
    if op not in OPS:
        raise ValueError("all_reduce op must be one of %s, got %r" % (", ".join(OPS), op))
    dtype = np.dtype(dtype)
    if dtype.kind not in "iufc":
        raise TypeError("all_reduce needs a numeric array (integer, float or complex), got %s"
                        % dtype)
    if op == "mean" and dtype.kind in "iu":
        raise TypeError("all_reduce op 'mean' needs a float array, got %s: reduce with 'sum' "
                        "and divide, or convert to float first" % dtype)
    if op in ("max", "min") and dtype.kind == "c":
        raise TypeError("all_reduce op %r is not defined for complex %s" % (op, dtype))


def combine(result, rows, op):
    """result = rows[0] op rows[1] op ... in that order (a mean's sum: the caller divides);
    every reduction of all_reduce, so that all give the same bits."""
    ufunc = _UFUNCS[op]
    np.copyto(result, rows[0])
    for row in rows[1:]:
        ufunc(result, row, out=result)


def reduction_layout(dtype_str, slots, count):
    """The segment of an all_reduce buffer: two sets of `slots` slots and the controller's
    result row; control words (int64): each worker's round, each worker's op by parity,
    the last committed round, and 1 + the id of a worker that left (0: none)."""
    return [{"dtype": dtype_str, "shape": [2 * slots + 1, count]},
            {"dtype": "<i8", "shape": [3 * slots + 2]}]
