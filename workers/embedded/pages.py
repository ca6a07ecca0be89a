"""Handing memory back to the kernel once the model is built: the resident pages of
memory-mapped weights no product reads any more, and the heap pages glibc keeps after
the build's temporaries are freed. Linux and glibc; elsewhere both do nothing.

PSS (what docs/WORKER.md, "Memory", measures) counts a process's resident pages; a
mapped checkpoint page counts 1/n in each of the n workers that touched it, a private
page fully in one. Dropping a clean page of a private file mapping (`MADV_DONTNEED`)
keeps its contents: the next read faults it in again from the page cache.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
from collections.abc import Iterable
from pathlib import Path

import torch

MADV_DONTNEED = 4  # <sys/mman.h>, Linux


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6", use_errno=True)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "madvise") else None


def mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """[start, end) of each of this process's mappings of the file at `path`."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return []
    target = str(path.resolve())
    ranges = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == target:
            start, end = fields[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


def release_mapped(tensors: Iterable[torch.Tensor], path: Path) -> int:
    """Drop this process's resident pages of the tensors' data that lie in a mapping of
    the file at `path`; returns the bytes dropped. Only for tensors read from the file and
    never written since (a written page of a private mapping would revert to the file's
    contents); a tensor outside the mapping (a cast copy) is left alone. The partial
    pages at either end of a tensor stay (a neighbour may be in use)."""
    libc = _libc()
    ranges = mapped_ranges(path)
    if libc is None or not ranges:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = mmap.PAGESIZE
    released = 0
    for tensor in tensors:
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        if not tensor.is_contiguous() or not any(lo <= start and end <= hi for lo, hi in ranges):
            continue
        first, last = -(-start // page) * page, end // page * page
        if last > first and libc.madvise(first, last - first, MADV_DONTNEED) == 0:
            released += last - first
    return released


def trim_heap() -> bool:
    """Return the free pages of every malloc arena to the kernel (`malloc_trim(0)`):
    building the inference copies frees float32 temporaries that glibc otherwise keeps
    as resident heap. Whether any memory was released."""
    libc = _libc()
    return libc is not None and bool(libc.malloc_trim(0))
