"""Where glibc puts a 1 MiB block, and whether freeing it shrinks the heap: python
heap_probe.py keep|default (keep: `keep_heap()` first). Prints "MMAPPED n GREW g SHRANK s":
n blocks mapped for it, whether the heap grew by it, whether freeing it shrank the heap."""

import ctypes
import sys

from platoon._os.heap import keep_heap


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "keep":
    keep_heap()
before = libc.mallinfo2()
block = libc.malloc(1 << 20)
during = libc.mallinfo2()
libc.free(block)
after = libc.mallinfo2()
print("MMAPPED %d GREW %s SHRANK %s" % (during.hblks - before.hblks,
                                        during.arena - before.arena >= 1 << 20,
                                        after.arena < during.arena))
