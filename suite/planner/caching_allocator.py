"""What PyTorch's CUDA caching allocator reserves for a sequence of allocations and frees: the
bytes ``torch.cuda.max_memory_reserved`` reports, beside the allocated peak the planner counts.

The allocator (c10/cuda/CUDACachingAllocator.cpp, the native backend's defaults: no
``max_split_size_mb``, no ``expandable_segments``) never hands memory back to CUDA while it
has room; it keeps freed blocks cached and serves later requests from them:

- a request is rounded up to a multiple of 512 bytes;
- requests up to 1 MiB come from the small pool, in 2 MiB segments; larger ones from the large
  pool, in a 20 MiB segment under 10 MiB and in a segment of their own size rounded up to 2 MiB
  from 10 MiB up;
- a request takes the smallest cached free block of its pool and stream that fits (best fit);
  the rest of the block is split off as a free block where it is at least 512 bytes (small
  pool) or more than 1 MiB (large pool), else the request keeps the whole block;
- a freed block merges with its free neighbours in the same segment;
- blocks belong to the stream they were allocated on: a block cached by one stream (FSDP's
  all-gather or reduce-scatter stream) is never handed to another (the compute stream).

So the reserved peak exceeds the allocated peak by rounding, by free pieces of cached segments
too small for the request at hand (fragmentation: activations of different sizes alive at
different times), and by what side streams keep cached. Not modelled: the release of cached
segments and retry when ``cudaMalloc`` fails (memory pressure), which lowers reserved memory to
what the allocated bytes and fragmentation need.
"""
from __future__ import annotations

import bisect

MIN_BLOCK_BYTES = 512
SMALL_REQUEST_BYTES = 1 << 20  # up to this: small pool
SMALL_SEGMENT_BYTES = 2 << 20
MIN_LARGE_ALLOC_BYTES = 10 << 20  # under this: a 20 MiB segment
LARGE_SEGMENT_BYTES = 20 << 20
ROUND_LARGE_BYTES = 2 << 20


def round_bytes(size: int) -> int:
    return max(MIN_BLOCK_BYTES, -(-size // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)


def segment_bytes(rounded: int) -> int:
    if rounded <= SMALL_REQUEST_BYTES:
        return SMALL_SEGMENT_BYTES
    if rounded < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return -(-rounded // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


class CachingAllocator:
    """The allocator's pools (module doc): ``malloc(size, stream)`` returns a handle for
    ``free``; ``reserved``/``allocated`` now and their peaks, in bytes."""

    def __init__(self):
        self.reserved = self.allocated = self.peak_reserved = self.peak_allocated = 0
        self._free: dict[tuple, list] = {}  # (stream, small) -> sorted [(size, address)] of free blocks
        self._blocks: dict[int, list] = {}  # address -> [size, segment, free, stream, small]
        self._starts: dict[int, int] = {}  # a block's end address -> its address (to merge with it)
        self._next_address = 0

    def malloc(self, size: int, stream="compute") -> int:
        rounded = round_bytes(size)
        small = rounded <= SMALL_REQUEST_BYTES
        pool = self._free.setdefault((stream, small), [])
        i = bisect.bisect_left(pool, (rounded, -1))
        if i < len(pool):
            _, address = pool.pop(i)
        else:  # a new segment from CUDA
            address = self._next_address
            self._place(address, [segment_bytes(rounded), address, True, stream, small])
            self._next_address += self._blocks[address][0]
            self.reserved += self._blocks[address][0]
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        block = self._blocks[address]
        rest = block[0] - rounded
        if rest >= MIN_BLOCK_BYTES if small else rest > SMALL_REQUEST_BYTES:
            block[0] = rounded
            self._place(address, block)
            self._place(address + rounded, [rest, block[1], True, stream, small])
            bisect.insort(pool, (rest, address + rounded))
        block[2] = False
        self.allocated += block[0]
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return address

    def free(self, address: int) -> None:
        block = self._blocks[address]
        block[2] = True
        self.allocated -= block[0]
        pool = self._free[(block[3], block[4])]
        after = self._blocks.get(address + block[0])
        if after is not None and after[2] and after[1] == block[1]:  # merge the next free block
            pool.remove((after[0], address + block[0]))
            del self._blocks[address + block[0]]
            del self._starts[address + block[0] + after[0]]
            block[0] += after[0]
            self._place(address, block)
        start = self._starts.get(address)
        before = self._blocks.get(start) if start is not None else None
        if before is not None and before[2] and before[1] == block[1]:  # merge into the previous free block
            pool.remove((before[0], start))
            del self._blocks[address]
            del self._starts[address]
            before[0] += block[0]
            self._place(start, before)
            address, block = start, before
        bisect.insort(pool, (block[0], address))

    def _place(self, address: int, block: list) -> None:
        self._blocks[address] = block
        self._starts[address + block[0]] = address


def replay(events, persistent=(), steps: int = 2) -> dict:
    """Peak reserved and allocated bytes of ``steps`` repeats of one step's ``events`` —
    ``("alloc", key, bytes, stream)`` and ``("free", key)`` in order — after the ``persistent``
    allocations (sizes held through the step: parameters, optimizer state). What a step leaves
    allocated, the next one replaces: freed as the repeat starts. The second repeat is the steady
    state, which serves its requests from what the first left cached."""
    allocator = CachingAllocator()
    for size in persistent:
        allocator.malloc(size)
    requested = peak_requested = sum(persistent)
    for _ in range(steps):
        live = {}
        for event in events:
            if event[0] == "alloc":
                live[event[1]] = (allocator.malloc(event[2], event[3]), event[2])
                requested += event[2]
                peak_requested = max(peak_requested, requested)
            elif event[1] in live:
                address, size = live.pop(event[1])
                allocator.free(address)
                requested -= size
        for address, size in live.values():
            allocator.free(address)
            requested -= size
    return {"reserved_bytes": allocator.peak_reserved, "allocated_bytes": allocator.peak_allocated,
            "requested_bytes": peak_requested}


def one_after_another(sizes, stream: str) -> list[tuple]:
    """Events of buffers on one stream, each freed once the next is allocated (a collective's
    buffer lives until the next one is issued: two in flight)."""
    events = []
    for i, size in enumerate(sizes):
        events.append(("alloc", i, size, stream))
        if i:
            events.append(("free", i - 1))
    return events
