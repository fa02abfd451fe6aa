"""The framework caching allocator (PyTorch / torch_npu NPUCachingAllocator) over the driver.

Segments come from the driver (``DriverAllocator.malloc_align32``, as torch_npu calls
aclrtMallocAlign32) and are cut into blocks; a freed block goes back to the cache, not the
driver, so ``reserved - allocated`` is memory held but unused: fragmentation. Pure logic.

From the PyTorch CUDACachingAllocator / torch_npu NPUCachingAllocator source:
- Requests are rounded up to 512 B (kMinBlockSize); torch_npu first adds 32 B (``pad_bytes``;
  0 on Ascend 910_95 and later, and in CUDA PyTorch). Pool and segment size follow the rounded size.
- Small pool: rounded size <= 1 MiB, served from 2 MiB segments. Large pool: 20 MiB segments for
  sizes < 10 MiB, otherwise the size rounded up to 2 MiB.
- Best fit per (stream, pool) keyed by (size, address); a block is split when the remainder is
  >= 512 B (small pool) or > 1 MiB (large pool); the allocated part is the front of the block.
- Freed blocks merge with free neighbours in the same segment; a block is only reused on the
  stream its segment was created for.
- On a failed driver allocation all wholly free segments are released (empty_cache) and the
  allocation is retried once; then it is an out-of-memory error.
- torch_npu allocates segments with ACL_MEM_MALLOC_HUGE_FIRST (the default ``policy`` here).
- ``record_stream(addr, stream)`` (``Tensor.record_stream``) marks a block as used by another
  stream; freeing it then waits for that stream's work queued so far (the caller's ``wait_for``
  records an event on each such stream, as the allocator's insert_events does) before the block
  goes back to its pool. Allocated bytes drop at the free; the block stays reserved and is not
  handed out until then. Pending frees are processed at the next malloc and at empty_cache.
Not modelled: max_split_size / expandable segments / garbage collection, graph-capture pools.
Zero-byte requests raise ValueError instead of returning a null pointer.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass
from typing import Callable, NamedTuple

from runtime_emu.memory import (
    Allocation,
    DriverAllocator,
    MallocPolicy,
    MiB,
    OutOfMemory,
    RecentFrees,
    round_up,
)

MIN_BLOCK_BYTES = 512                # kMinBlockSize
SMALL_SIZE_BYTES = 1 * MiB           # kSmallSize: largest request of the small pool
SMALL_SEGMENT_BYTES = 2 * MiB        # kSmallBuffer
LARGE_SEGMENT_BYTES = 20 * MiB       # kLargeBuffer
MIN_LARGE_ALLOC_BYTES = 10 * MiB     # kMinLargeAlloc: from here segments fit the request
ROUND_LARGE_BYTES = 2 * MiB          # kRoundLarge
TORCH_NPU_PAD_BYTES = 32             # torch_npu round_size() adds 32 B on 910B and older


def round_size(size: int, pad_bytes: int = TORCH_NPU_PAD_BYTES) -> int:
    """Block size for a request: (size + pad) rounded up to 512 B."""
    return round_up(size + pad_bytes, MIN_BLOCK_BYTES)


def segment_size(block_bytes: int) -> int:
    """Segment size requested from the driver for a block of ``block_bytes``."""
    if block_bytes <= SMALL_SIZE_BYTES:
        return SMALL_SEGMENT_BYTES
    if block_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_SEGMENT_BYTES
    return round_up(block_bytes, ROUND_LARGE_BYTES)


class BlockInfo(NamedTuple):
    addr: int
    size: int
    allocated: bool
    stream: int


class SegmentInfo(NamedTuple):
    addr: int
    bytes: int
    stream: int
    pool: str          # "small" or "large"
    huge: bool
    blocks: tuple[BlockInfo, ...]


@dataclass(eq=False, slots=True)
class _Block:
    addr: int
    size: int
    stream: int
    small: bool
    huge: bool
    allocated: bool = False
    requested: int = 0
    prev: _Block | None = None
    next: _Block | None = None
    #: Streams other than its own that used it while allocated (record_stream).
    stream_uses: frozenset[int] = frozenset()
    #: Freed, waiting for those streams' work before it goes back to its pool.
    pending: bool = False


class CachingAllocator:
    """Segments from the driver, split into blocks, cached per (stream, pool) on free."""

    def __init__(self, driver: DriverAllocator, *, policy: MallocPolicy = MallocPolicy.HUGE_FIRST,
                 pad_bytes: int = TORCH_NPU_PAD_BYTES) -> None:
        self.driver = driver
        self.policy = MallocPolicy(policy)
        self.pad_bytes = pad_bytes
        self.allocated_bytes = 0
        self.reserved_bytes = 0
        self.retries = 0             # driver failures answered by empty_cache + retry (num_alloc_retries)
        # Free blocks of each (stream, small) pool as sorted (size, addr) keys: best fit = bisect.
        self._pools: dict[tuple[int, bool], list[tuple[int, int]]] = {}
        self._blocks: dict[int, _Block] = {}       # every block, free or not, by address
        self._segments: dict[int, int] = {}        # segment address -> segment bytes
        self._recent = RecentFrees()
        #: Freed blocks waiting for the streams that used them: (block, whether their work is done).
        self._pending: list[tuple[_Block, Callable[[], bool]]] = []

    @property
    def fragmentation_bytes(self) -> int:
        """Reserved but not allocated: cached free blocks."""
        return self.reserved_bytes - self.allocated_bytes

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    def malloc(self, size: int, stream: int = 0) -> Allocation:
        """Best-fit cached block for ``stream``, else a new segment; ``bytes`` is the block size."""
        if size <= 0:
            raise ValueError(f"allocation size must be positive, got {size}")
        self.process_pending()
        nbytes = round_size(size, self.pad_bytes)
        small = nbytes <= SMALL_SIZE_BYTES
        pool = self._pools.setdefault((stream, small), [])
        i = bisect_left(pool, (nbytes, -1))
        if i < len(pool):
            block = self._blocks[pool.pop(i)[1]]
        else:
            block = self._new_segment(size, nbytes, small, stream)
        remaining = block.size - nbytes
        if (remaining >= MIN_BLOCK_BYTES) if small else (remaining > SMALL_SIZE_BYTES):
            tail = _Block(block.addr + nbytes, remaining, stream, small, block.huge, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = nbytes
            self._blocks[tail.addr] = tail
            insort(pool, (remaining, tail.addr))
        block.allocated = True
        block.requested = size
        self.allocated_bytes += block.size
        self._recent.discard(block.addr)
        return Allocation(block.addr, size, block.size, block.huge)

    def record_stream(self, addr: int, stream: int) -> None:
        """The allocated block at `addr` is used by `stream` as well as its own: its free waits for
        that stream's work (`free`'s `wait_for`)."""
        block = self._blocks.get(addr)
        if block is None or not block.allocated:
            raise self._recent.error(addr, owner="the caching allocator")
        if stream != block.stream:
            block.stream_uses = block.stream_uses | {stream}

    def free(self, addr: int, wait_for: Callable[[frozenset[int]], Callable[[], bool]] | None = None) -> Allocation:
        """Return a block to its pool (not to the driver), merged with free neighbours. A block
        other streams used (`record_stream`) goes back once `wait_for(those streams)` -- called
        now, it returns whether their work queued so far is done -- says so (without `wait_for`,
        at once)."""
        block = self._blocks.get(addr)
        if block is None or not block.allocated:
            raise self._recent.error(addr, owner="the caching allocator")
        freed = Allocation(addr, block.requested, block.size, block.huge)
        block.allocated = False
        block.requested = 0
        self.allocated_bytes -= block.size
        self._recent.add(addr)
        uses, block.stream_uses = block.stream_uses, frozenset()
        if uses and wait_for is not None:
            block.pending = True
            self._pending.append((block, wait_for(uses)))
            return freed
        self._release(block)
        return freed

    def process_pending(self) -> int:
        """Return the pending frees whose streams are done to their pools; how many are left."""
        if self._pending:
            left = []
            for block, done in self._pending:
                if done():
                    block.pending = False
                    self._release(block)
                else:
                    left.append((block, done))
            self._pending = left
        return len(self._pending)

    def _release(self, block: _Block) -> None:
        """A free block into its pool, merged with its free neighbours (not pending ones)."""
        pool = self._pools[(block.stream, block.small)]
        prev = block.prev
        if prev is not None and not prev.allocated and not prev.pending:
            self._unlink(pool, prev)
            self._absorb_next(prev)
            block = prev
        nxt = block.next
        if nxt is not None and not nxt.allocated and not nxt.pending:
            self._unlink(pool, nxt)
            self._absorb_next(block)
        insort(pool, (block.size, block.addr))

    def empty_cache(self) -> int:
        """Release every wholly free segment to the driver; returns the bytes released."""
        self.process_pending()
        released = 0
        for addr in [a for a in self._segments if self._whole_segment_free(a)]:
            block = self._blocks.pop(addr)
            self._unlink(self._pools[(block.stream, block.small)], block)
            self.driver.free(addr)
            released += self._segments.pop(addr)
        self.reserved_bytes -= released
        return released

    def snapshot(self) -> list[SegmentInfo]:
        """Segments by address with their blocks in address order."""
        segments = []
        for addr in sorted(self._segments):
            head = self._blocks[addr]
            block: _Block | None = head
            blocks = []
            while block is not None:
                blocks.append(BlockInfo(block.addr, block.size, block.allocated, block.stream))
                block = block.next
            segments.append(SegmentInfo(addr, self._segments[addr], head.stream,
                                        "small" if head.small else "large", head.huge, tuple(blocks)))
        return segments

    def _new_segment(self, size: int, nbytes: int, small: bool, stream: int) -> _Block:
        seg_bytes = segment_size(nbytes)
        try:
            seg = self.driver.malloc_align32(seg_bytes, self.policy)
        except OutOfMemory:
            self.retries += 1
            self.empty_cache()
            try:
                seg = self.driver.malloc_align32(seg_bytes, self.policy)
            except OutOfMemory as err:
                raise self._out_of_memory(size, seg_bytes, stream) from err
        block = _Block(seg.addr, seg_bytes, stream, small, seg.huge)
        self._blocks[seg.addr] = block
        self._segments[seg.addr] = seg_bytes
        self.reserved_bytes += seg_bytes
        return block

    def _out_of_memory(self, size: int, seg_bytes: int, stream: int) -> OutOfMemory:
        regions = self.driver.regions_for(seg_bytes, self.policy)
        largest_cached = max((pool[-1][0] for pool in self._pools.values() if pool), default=0)
        return OutOfMemory(
            size, policy=self.policy, stream=stream,
            free_bytes=sum(r.free_bytes for r in regions) + self.fragmentation_bytes,
            largest_free_bytes=max(largest_cached, *(r.largest_free_bytes for r in regions)),
            reserved_bytes=self.reserved_bytes, allocated_bytes=self.allocated_bytes)

    def _whole_segment_free(self, addr: int) -> bool:
        block = self._blocks[addr]
        return not block.allocated and not block.pending and block.next is None

    def _unlink(self, pool: list[tuple[int, int]], block: _Block) -> None:
        del pool[bisect_left(pool, (block.size, block.addr))]

    def _absorb_next(self, block: _Block) -> None:
        nxt = block.next
        assert nxt is not None, "absorbing past the end of a segment"
        del self._blocks[nxt.addr]
        block.size += nxt.size
        block.next = nxt.next
        if nxt.next is not None:
            nxt.next.prev = block
