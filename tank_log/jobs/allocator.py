"""The allocator setting of a maintenance process (glibc only).

Decoding works in chunks: every chunk allocates multi-MiB buffers (the file bytes read, the decompressed message sets,
the columns) and frees them before the next. glibc serves blocks above its mmap threshold with fresh `mmap`s and
returns freed memory at the top of its heap to the kernel, so each chunk faulted its pages in anew: ~43,000 page
faults (0.15-0.2 s of system time) for one compaction of the BENCH.md partition (bench/RESULTS.md). With both
thresholds raised, freed buffers stay in the heap and the next chunk reuses them: ~4,500 faults. The peak memory is
unchanged (the same buffers are live at once); what changes is that a process keeps up to `TRIM_THRESHOLD` of freed
heap until it exits, which suits a job's worker.
"""

from __future__ import annotations

import ctypes
import functools

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # the most glibc accepts on 64-bit: every chunk buffer is served from the heap
TRIM_THRESHOLD = 256 << 20


@functools.cache
def reuse_freed_buffers() -> bool:
    """Have glibc keep freed chunk buffers for reuse (once per process); False where it does not apply (no glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
