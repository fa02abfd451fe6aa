"""Device memory as the AscendCL driver hands it out: aclrtMalloc / aclrtMallocAlign32 / aclrtFree.

Device memory is one address range. Its first ``huge_bytes`` are backed by 2 MiB huge pages, the
rest by normal pages; each region keeps an address-ordered free list (first fit, neighbours
coalesced on free). Pure logic: no time, no I/O, no globals. The caching allocator that
frameworks put on top lives in ``runtime_emu.caching``.

From the AscendCL docs (aclrtMalloc, aclrtMallocAlign32, aclrtMemMallocPolicy):
- aclrtMalloc rounds ``size`` up to a multiple of 32 B and adds 32 B; aclrtMallocAlign32 only
  rounds up to 32 B. Start addresses are 64 B aligned. ``size`` must not be 0.
- Policy values: HUGE_FIRST = 0, HUGE_ONLY = 1, NORMAL_ONLY = 2. Huge pages are taken in whole
  2 MiB pages. HUGE_FIRST serves requests <= 1 MiB from normal pages; larger ones from huge pages,
  falling back to normal pages. HUGE_ONLY fails when huge pages run out; NORMAL_ONLY uses only
  normal pages.
- aclrtFree releases at once, without synchronising (a use-after-free hazard, never a stall).

Inferred, not measured: the +32 B of aclrtMalloc also applies to 2 MiB huge pages (the docs
exempt only 1 GiB pages), so ``malloc(2 MiB, HUGE_ONLY)`` takes two pages.
Defaults, not facts: ``base_addr``, the split of capacity into huge and normal regions, and the
first-fit placement (the real driver's placement is not documented).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from enum import IntEnum
from itertools import compress, count

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

ROUND_BYTES = 32            # aclrtMalloc: round up to 32 B ...
PAD_BYTES = 32              # ... then add 32 B (aclrtMallocAlign32 does not)
ADDR_ALIGN = 64             # start addresses are 64 B aligned
HUGE_PAGE_BYTES = 2 * MiB
HUGE_FIRST_MIN_BYTES = 1 * MiB  # HUGE_FIRST requests <= 1 MiB still get normal pages
RECENT_FREES = 4096         # freed addresses remembered to tell a double free from a wild pointer


class MallocPolicy(IntEnum):
    """aclrtMemMallocPolicy (the ACL_MEM_MALLOC_* values)."""

    HUGE_FIRST = 0
    HUGE_ONLY = 1
    NORMAL_ONLY = 2


def format_bytes(nbytes: int) -> str:
    """Bytes the way runtime error messages print them: '1.50 GiB', '512.00 KiB', '96 B'."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class OutOfMemory(Exception):
    """A device allocation that could not be served, with the sizes that explain why.

    ``free_bytes`` / ``largest_free_bytes`` cover the memory the request could have used (the
    regions its policy allows; for the caching allocator, driver free memory plus cached free
    blocks). ``free_bytes >= requested_bytes > largest_free_bytes`` is fragmentation.
    """

    def __init__(self, requested_bytes: int, *, policy: MallocPolicy | None, free_bytes: int,
                 largest_free_bytes: int, where: str = "", reserved_bytes: int | None = None,
                 allocated_bytes: int | None = None, stream: int | None = None) -> None:
        self.requested_bytes = requested_bytes
        self.policy = policy
        self.free_bytes = free_bytes
        self.largest_free_bytes = largest_free_bytes
        self.reserved_bytes = reserved_bytes
        self.allocated_bytes = allocated_bytes
        self.stream = stream
        policy_text = f" (policy {policy.name})" if policy is not None else ""
        if reserved_bytes is None:
            message = (f"out of device memory: requested {format_bytes(requested_bytes)}{policy_text}; "
                       f"{format_bytes(free_bytes)} free{where}, "
                       f"largest free block {format_bytes(largest_free_bytes)}")
        else:
            cached = reserved_bytes - (allocated_bytes or 0)
            message = (f"out of device memory: tried to allocate {format_bytes(requested_bytes)} on stream "
                       f"{stream}{policy_text}; {format_bytes(free_bytes)} free "
                       f"({format_bytes(free_bytes - cached)} in the driver, {format_bytes(cached)} cached), "
                       f"largest free block {format_bytes(largest_free_bytes)}; caching allocator: "
                       f"{format_bytes(reserved_bytes)} reserved, {format_bytes(allocated_bytes or 0)} allocated")
        super().__init__(message)


class InvalidPointer(Exception):
    """aclrtFree of an address that is not a live allocation: a double free or a wild pointer."""

    def __init__(self, addr: int, *, double_free: bool, owner: str = "aclrtMalloc") -> None:
        self.addr = addr
        self.double_free = double_free
        if double_free:
            message = f"double free of device pointer {addr:#x}"
        else:
            message = f"free of unknown device pointer {addr:#x} (never returned by {owner})"
        super().__init__(message)


class RecentFrees:
    """A bounded, insertion-ordered set of freed addresses (enough to name a double free)."""

    def __init__(self, limit: int = RECENT_FREES) -> None:
        self._limit = limit
        self._addrs: dict[int, None] = {}

    def add(self, addr: int) -> None:
        self._addrs[addr] = None
        if len(self._addrs) > self._limit:
            del self._addrs[next(iter(self._addrs))]

    def discard(self, addr: int) -> None:
        self._addrs.pop(addr, None)

    def error(self, addr: int, owner: str = "aclrtMalloc") -> InvalidPointer:
        """The exception for freeing ``addr``, which is not live."""
        return InvalidPointer(addr, double_free=addr in self._addrs, owner=owner)


@dataclass(frozen=True, slots=True)
class Allocation:
    """One live allocation: ``size`` as requested, ``bytes`` as actually reserved."""

    addr: int
    size: int
    bytes: int
    huge: bool


class Region:
    """A contiguous address range with an address-ordered free list (first fit, coalescing)."""

    def __init__(self, name: str, start: int, capacity_bytes: int, align: int) -> None:
        self.name = name
        self.start = start
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._align = align
        # Parallel sorted lists: bisect on addresses, C-speed max() on sizes.
        self._addrs: list[int] = [start] if capacity_bytes else []
        self._sizes: list[int] = [capacity_bytes] if capacity_bytes else []

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    @property
    def largest_free_bytes(self) -> int:
        return max(self._sizes, default=0)

    def free_blocks(self) -> list[tuple[int, int]]:
        """The free list as (addr, bytes), by address."""
        return list(zip(self._addrs, self._sizes))

    def take(self, nbytes: int) -> int | None:
        """Carve ``nbytes`` from the first free block that fits at an aligned address."""
        addrs, sizes, align = self._addrs, self._sizes, self._align
        # Indices of blocks big enough, found at C speed: alignment gaps leave many tiny fragments.
        for i in compress(count(), map(nbytes.__le__, sizes)):
            addr, size = addrs[i], sizes[i]
            start = round_up(addr, align)
            tail = addr + size - start - nbytes
            if tail < 0:
                continue
            if start > addr:
                # The alignment gap stays free as its own fragment; it coalesces when a neighbour is freed.
                sizes[i] = start - addr
                if tail:
                    addrs.insert(i + 1, start + nbytes)
                    sizes.insert(i + 1, tail)
            elif tail:
                addrs[i] = start + nbytes
                sizes[i] = tail
            else:
                del addrs[i], sizes[i]
            self.used_bytes += nbytes
            return start
        return None

    def give(self, addr: int, nbytes: int) -> None:
        """Return a block to the free list, merging it with free neighbours."""
        addrs, sizes = self._addrs, self._sizes
        i = bisect_left(addrs, addr)
        joins_prev = i > 0 and addrs[i - 1] + sizes[i - 1] == addr
        joins_next = i < len(addrs) and addrs[i] == addr + nbytes
        if joins_prev and joins_next:
            sizes[i - 1] += nbytes + sizes[i]
            del addrs[i], sizes[i]
        elif joins_prev:
            sizes[i - 1] += nbytes
        elif joins_next:
            addrs[i] = addr
            sizes[i] += nbytes
        else:
            addrs.insert(i, addr)
            sizes.insert(i, nbytes)
        self.used_bytes -= nbytes


class DriverAllocator:
    """aclrtMalloc / aclrtMallocAlign32 / aclrtFree over one device's memory."""

    def __init__(self, capacity_bytes: int, huge_bytes: int, *, base_addr: int = 0x1_0000_0000,
                 page_bytes: int = HUGE_PAGE_BYTES) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be positive, got {capacity_bytes}")
        if page_bytes <= 0 or page_bytes % ADDR_ALIGN:
            raise ValueError(f"page_bytes must be a positive multiple of {ADDR_ALIGN}, got {page_bytes}")
        if not 0 <= huge_bytes <= capacity_bytes or huge_bytes % page_bytes:
            raise ValueError(f"huge_bytes must be a multiple of {page_bytes} within the capacity, got {huge_bytes}")
        if base_addr < 0 or base_addr % page_bytes:
            raise ValueError(f"base_addr must be aligned to {page_bytes}, got {base_addr:#x}")
        self.page_bytes = page_bytes
        self.huge = Region("huge", base_addr, huge_bytes, page_bytes)
        self.normal = Region("normal", base_addr + huge_bytes, capacity_bytes - huge_bytes, ADDR_ALIGN)
        self._live: dict[int, Allocation] = {}
        self._recent = RecentFrees()

    def malloc(self, size: int, policy: MallocPolicy = MallocPolicy.HUGE_FIRST) -> Allocation:
        """aclrtMalloc: round up to 32 B, add 32 B, place by ``policy``."""
        return self._malloc(size, MallocPolicy(policy), PAD_BYTES)

    def malloc_align32(self, size: int, policy: MallocPolicy = MallocPolicy.HUGE_FIRST) -> Allocation:
        """aclrtMallocAlign32: like malloc without the extra 32 B (what torch_npu uses for segments)."""
        return self._malloc(size, MallocPolicy(policy), 0)

    def free(self, addr: int) -> Allocation:
        """aclrtFree: the block is free at once (no synchronisation)."""
        alloc = self._live.pop(addr, None)
        if alloc is None:
            raise self._recent.error(addr)
        (self.huge if alloc.huge else self.normal).give(addr, alloc.bytes)
        self._recent.add(addr)
        return alloc

    def regions_for(self, size: int, policy: MallocPolicy) -> tuple[Region, ...]:
        """The regions ``policy`` lets a ``size``-byte request use, in the order tried."""
        if policy is MallocPolicy.HUGE_ONLY:
            return (self.huge,)
        if policy is MallocPolicy.NORMAL_ONLY or size <= HUGE_FIRST_MIN_BYTES:
            return (self.normal,)
        return (self.huge, self.normal)

    @property
    def capacity_bytes(self) -> int:
        return self.huge.capacity_bytes + self.normal.capacity_bytes

    @property
    def used_bytes(self) -> int:
        return self.huge.used_bytes + self.normal.used_bytes

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    @property
    def largest_free_bytes(self) -> int:
        return max(self.huge.largest_free_bytes, self.normal.largest_free_bytes)

    @property
    def live_count(self) -> int:
        return len(self._live)

    def live_allocations(self) -> list[Allocation]:
        """Live allocations by address (for leak checks and invariants)."""
        return [self._live[a] for a in sorted(self._live)]

    def _malloc(self, size: int, policy: MallocPolicy, pad: int) -> Allocation:
        if size <= 0:
            raise ValueError(f"device allocation size must be positive, got {size}")
        nbytes = round_up(size, ROUND_BYTES) + pad
        regions = self.regions_for(size, policy)
        for region in regions:
            huge = region is self.huge
            need = round_up(nbytes, self.page_bytes) if huge else nbytes
            addr = region.take(need)
            if addr is not None:
                alloc = Allocation(addr, size, need, huge)
                self._live[addr] = alloc
                self._recent.discard(addr)
                return alloc
        where = " in " + " and ".join(r.name for r in regions) + " pages"
        raise OutOfMemory(size, policy=policy, free_bytes=sum(r.free_bytes for r in regions),
                          largest_free_bytes=max(r.largest_free_bytes for r in regions), where=where)


def __getattr__(name: str):
    # The caching allocator lives in runtime_emu.caching (which imports this module); keep
    # `from runtime_emu.memory import CachingAllocator` working for callers written before the split.
    if name == "CachingAllocator":
        from runtime_emu.caching import CachingAllocator

        return CachingAllocator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
