"""Device memory: the aclrtMalloc driver allocator and the torch_npu-style caching allocator.

Exact expectations, SimPy style: layouts are written out byte for byte and driver calls are
logged and compared as a whole. Sizes and rules come from the AscendCL docs and the PyTorch /
torch_npu allocator source (see the module docstrings); the 13-tensor layout is the one measured
on torch_npu 2.8.0 in a public write-up.
"""

from __future__ import annotations

import random

import pytest

from runtime_emu.caching import BlockInfo, CachingAllocator, SegmentInfo
from runtime_emu.memory import (
    Allocation,
    DriverAllocator,
    GiB,
    InvalidPointer,
    KiB,
    MallocPolicy,
    MiB,
    OutOfMemory,
)

BASE = 0x1_0000_0000
HUGE_FIRST, HUGE_ONLY, NORMAL_ONLY = MallocPolicy.HUGE_FIRST, MallocPolicy.HUGE_ONLY, MallocPolicy.NORMAL_ONLY


class LoggingDriver(DriverAllocator):
    """A driver that logs every segment request and release (addresses as offsets from BASE)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple] = []

    def malloc_align32(self, size, policy=HUGE_FIRST):
        try:
            alloc = super().malloc_align32(size, policy)
        except OutOfMemory:
            self.log.append(("oom", size))
            raise
        self.log.append(("malloc", alloc.addr - BASE, alloc.bytes))
        return alloc

    def free(self, addr):
        alloc = super().free(addr)
        self.log.append(("free", addr - BASE, alloc.bytes))
        return alloc


def layout(cache: CachingAllocator) -> list[tuple]:
    """The snapshot as (segment offset, pool, [(block offset in segment, size, allocated)])."""
    return [(s.addr - BASE, s.pool, [(b.addr - s.addr, b.size, b.allocated) for b in s.blocks])
            for s in cache.snapshot()]


def placed(allocs: list[Allocation]) -> list[tuple[int, int, bool]]:
    return [(a.addr - BASE, a.bytes, a.huge) for a in allocs]


# --- the driver allocator (aclrtMalloc / aclrtFree) --------------------------------------------

def test_policy_values_are_the_acl_ones():
    assert [(p.name, int(p)) for p in MallocPolicy] == [("HUGE_FIRST", 0), ("HUGE_ONLY", 1), ("NORMAL_ONLY", 2)]


def test_size_rule_rounds_to_32_adds_32_and_aligns_to_64():
    drv = DriverAllocator(64 * MiB, 0)
    assert [drv.malloc(n) for n in (1, 32, 33, 1)] == [
        Allocation(BASE, 1, 64, False),
        Allocation(BASE + 64, 32, 64, False),
        Allocation(BASE + 128, 33, 96, False),
        Allocation(BASE + 256, 1, 64, False),   # 64 B aligned: the 32 B after the 96 B block stays free
    ]
    assert drv.normal.free_blocks() == [(BASE + 224, 32), (BASE + 320, 64 * MiB - 320)]
    assert (drv.used_bytes, drv.free_bytes, drv.live_count) == (288, 64 * MiB - 288, 4)
    assert drv.malloc_align32(33) == Allocation(BASE + 320, 33, 64, False)   # no extra 32 B


def test_huge_pages_are_taken_whole_and_small_huge_first_requests_get_normal_pages():
    drv = DriverAllocator(64 * MiB, 8 * MiB)
    got = [drv.malloc(3 * MiB), drv.malloc(1 * MiB), drv.malloc(100, HUGE_ONLY)]
    assert placed(got) == [
        (0, 4 * MiB, True),               # 3 MiB + 32 B -> two 2 MiB pages
        (8 * MiB, 1 * MiB + 32, False),   # HUGE_FIRST, <= 1 MiB: normal pages
        (4 * MiB, 2 * MiB, True),         # HUGE_ONLY: a whole page even for 100 B
    ]
    # aclrtMalloc's extra 32 B turn 2 MiB into two pages; aclrtMallocAlign32 fits the last one.
    with pytest.raises(OutOfMemory) as err:
        drv.malloc(2 * MiB, HUGE_ONLY)
    assert str(err.value) == ("out of device memory: requested 2.00 MiB (policy HUGE_ONLY); "
                              "2.00 MiB free in huge pages, largest free block 2.00 MiB")
    assert placed([drv.malloc_align32(2 * MiB, HUGE_ONLY)]) == [(6 * MiB, 2 * MiB, True)]


def test_huge_first_falls_back_to_normal_while_huge_only_raises_naming_the_sizes():
    drv = DriverAllocator(8 * GiB, 4 * GiB)
    pieces = [drv.malloc_align32(512 * MiB, HUGE_ONLY) for _ in range(8)]
    for piece in pieces[::2]:
        drv.free(piece.addr)
    assert (drv.huge.free_bytes, drv.huge.largest_free_bytes) == (2 * GiB, 512 * MiB)

    with pytest.raises(OutOfMemory) as err:
        drv.malloc(1536 * MiB, HUGE_ONLY)
    oom = err.value
    assert str(oom) == ("out of device memory: requested 1.50 GiB (policy HUGE_ONLY); "
                        "2.00 GiB free in huge pages, largest free block 512.00 MiB")
    assert (oom.requested_bytes, oom.policy, oom.free_bytes, oom.largest_free_bytes) == (
        1536 * MiB, HUGE_ONLY, 2 * GiB, 512 * MiB)
    assert (oom.reserved_bytes, oom.allocated_bytes) == (None, None)

    fallback = drv.malloc(1536 * MiB, HUGE_FIRST)
    assert placed([fallback]) == [(4 * GiB, 1536 * MiB + 32, False)]


def test_normal_only_never_touches_huge_pages():
    drv = DriverAllocator(64 * MiB, 32 * MiB)
    got = []
    with pytest.raises(OutOfMemory) as err:
        while True:
            got.append(drv.malloc(4 * MiB, NORMAL_ONLY))
    step = 4 * MiB + 64          # 4 MiB + 32 B, then the next start is 64 B aligned
    assert placed(got) == [(32 * MiB + i * step, 4 * MiB + 32, False) for i in range(7)]
    assert (drv.huge.used_bytes, drv.huge.free_bytes) == (0, 32 * MiB)
    assert (err.value.free_bytes, err.value.largest_free_bytes) == (4 * MiB - 224, 4 * MiB - 416)
    assert str(err.value).endswith("free in normal pages, largest free block 4.00 MiB")


def test_free_coalesces_neighbours_back_into_one_block():
    drv = DriverAllocator(16 * MiB, 0)
    a, b, c = (drv.malloc(1000) for _ in range(3))          # 1056 B each, 64 B aligned
    log = []
    for victim in (b, a, c):
        assert drv.free(victim.addr) == victim
        log.append([(addr - BASE, n) for addr, n in drv.normal.free_blocks()])
    assert log == [
        [(1056, 1120), (3232, 16 * MiB - 3232)],           # b and the 32 B alignment gaps either side
        [(0, 2176), (3232, 16 * MiB - 3232)],              # a joins them
        [(0, 16 * MiB)],                                   # c joins both sides
    ]
    assert (drv.used_bytes, drv.live_count, drv.largest_free_bytes) == (0, 0, 16 * MiB)


def test_many_live_blocks_free_in_any_order_back_to_the_full_capacity():
    rng = random.Random(7)
    drv = DriverAllocator(512 * MiB, 64 * MiB)
    allocs = [drv.malloc(rng.randint(1, 64 * KiB), HUGE_ONLY if i % 250 == 0 else rng.choice([HUGE_FIRST, NORMAL_ONLY]))
              for i in range(5000)]
    assert (drv.live_count, drv.huge.used_bytes) == (5000, 20 * 2 * MiB)
    rng.shuffle(allocs)
    for alloc in allocs:
        drv.free(alloc.addr)
    assert drv.huge.free_blocks() == [(BASE, 64 * MiB)]
    assert drv.normal.free_blocks() == [(BASE + 64 * MiB, 448 * MiB)]
    assert (drv.free_bytes, drv.capacity_bytes, drv.largest_free_bytes) == (512 * MiB, 512 * MiB, 448 * MiB)


def test_double_free_and_unknown_pointer_name_the_address():
    drv = DriverAllocator(16 * MiB, 0)
    a = drv.malloc(100)
    drv.free(a.addr)
    with pytest.raises(InvalidPointer, match=r"^double free of device pointer 0x100000000$") as err:
        drv.free(a.addr)
    assert (err.value.addr, err.value.double_free) == (BASE, True)
    with pytest.raises(InvalidPointer) as err:
        drv.free(BASE + 0x40)
    assert str(err.value) == "free of unknown device pointer 0x100000040 (never returned by aclrtMalloc)"
    again = drv.malloc(100)                  # first fit hands the address out again: freeing it is legal
    assert drv.free(again.addr) == Allocation(BASE, 100, 160, False)


@pytest.mark.parametrize("bad", [0, -1])
def test_size_must_be_positive(bad):
    with pytest.raises(ValueError):
        DriverAllocator(16 * MiB, 0).malloc(bad)
    with pytest.raises(ValueError):
        CachingAllocator(DriverAllocator(16 * MiB, 0)).malloc(bad)


def test_constructor_rejects_misaligned_layouts():
    for kwargs in ({"capacity_bytes": 16 * MiB, "huge_bytes": 3 * MiB},
                   {"capacity_bytes": 16 * MiB, "huge_bytes": 32 * MiB},
                   {"capacity_bytes": 16 * MiB, "huge_bytes": 0, "base_addr": 0x1000}):
        with pytest.raises(ValueError):
            DriverAllocator(**kwargs)


# --- the caching allocator ---------------------------------------------------------------------

def test_free_then_malloc_of_the_same_size_reuses_the_block_without_a_driver_call():
    drv = LoggingDriver(64 * MiB, 0)
    cache = CachingAllocator(drv)
    a = cache.malloc(4000)
    assert a == Allocation(BASE, 4000, 4096, False)          # (4000 + 32) rounded up to 512 B
    cache.free(a.addr)
    assert (cache.allocated_bytes, cache.reserved_bytes, cache.fragmentation_bytes) == (0, 2 * MiB, 2 * MiB)
    assert cache.malloc(4000) == a
    assert drv.log == [("malloc", 0, 2 * MiB)]


def test_torch_npu_layout_of_13_tensors_matches_the_measured_one():
    drv = LoggingDriver(64 * MiB, 16 * MiB)
    cache = CachingAllocator(drv)
    sizes_kib = [512, 512, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 2]
    got = [cache.malloc(n * KiB) for n in sizes_kib]
    assert [a.addr - BASE for a in got] == [
        0, 524_800, 1_049_600, 1_051_136, 1_053_696, 1_058_304, 1_067_008, 1_083_904, 1_117_184,
        1_183_232, 1_314_816, 2 * MiB, 1_577_472,   # #12 opens segment 2; #13 best-fits back into segment 1
    ]
    assert [a.bytes - a.size for a in got] == [512] * 13
    assert (cache.allocated_bytes, cache.reserved_bytes, cache.segment_count) == (2_104_832, 4 * MiB, 2)
    assert drv.log == [("malloc", 0, 2 * MiB), ("malloc", 2 * MiB, 2 * MiB)]
    assert all(a.huge for a in got)                             # HUGE_FIRST segments, as torch_npu asks


def test_split_and_merge_exact_block_layouts():
    cache = CachingAllocator(LoggingDriver(64 * MiB, 0), pad_bytes=0)
    a, b, c = cache.malloc(1000), cache.malloc(5000), cache.malloc(512)
    assert cache.snapshot() == [SegmentInfo(BASE, 2 * MiB, 0, "small", False, (
        BlockInfo(BASE, 1024, True, 0), BlockInfo(BASE + 1024, 5120, True, 0),
        BlockInfo(BASE + 6144, 512, True, 0), BlockInfo(BASE + 6656, 2 * MiB - 6656, False, 0)))]
    log = []
    cache.free(b.addr)
    d = cache.malloc(2000)                       # best fit: the 5120 B hole, not the 2 MiB tail
    log.append(layout(cache))
    cache.free(a.addr)
    cache.free(d.addr)                           # merges with a before it and the rest of the hole after
    log.append(layout(cache))
    cache.free(c.addr)
    log.append(layout(cache))
    assert log == [
        [(0, "small", [(0, 1024, True), (1024, 2048, True), (3072, 3072, False), (6144, 512, True),
                       (6656, 2 * MiB - 6656, False)])],
        [(0, "small", [(0, 6144, False), (6144, 512, True), (6656, 2 * MiB - 6656, False)])],
        [(0, "small", [(0, 2 * MiB, False)])],
    ]


def test_split_thresholds_small_pool_at_512_large_pool_above_1mib():
    cache = CachingAllocator(LoggingDriver(256 * MiB, 0), pad_bytes=0)
    cache.malloc(1 * MiB)
    cache.malloc(1 * MiB - 512)                  # leaves exactly 512 B: split
    big = cache.malloc(19 * MiB + 512 * KiB)     # 20 MiB segment, 512 KiB left: no split, block is 20 MiB
    mid = cache.malloc(3 * MiB)                  # 20 MiB segment, 17 MiB left: split
    assert big.bytes == 20 * MiB and mid.bytes == 3 * MiB
    assert layout(cache) == [
        (0, "small", [(0, 1 * MiB, True), (1 * MiB, 1 * MiB - 512, True), (2 * MiB - 512, 512, False)]),
        (2 * MiB, "large", [(0, 20 * MiB, True)]),
        (22 * MiB, "large", [(0, 3 * MiB, True), (3 * MiB, 17 * MiB, False)]),
    ]
    assert cache.allocated_bytes == 2 * MiB - 512 + 23 * MiB


def test_segment_sizes_per_pool():
    drv = LoggingDriver(256 * MiB, 0)
    for pad_bytes, size in ((0, 1 * MiB), (0, 1 * MiB + 1), (0, 10 * MiB - 512), (0, 10 * MiB),
                            (0, 11 * MiB + 1), (32, 1 * MiB)):
        CachingAllocator(drv, pad_bytes=pad_bytes).malloc(size)   # a fresh cache: every request opens a segment
    # <= 1 MiB: 2 MiB; below 10 MiB: 20 MiB (PyTorch's `size < kMinLargeAlloc`); else rounded to 2 MiB.
    # torch_npu's +32 B pushes a 1 MiB tensor into the large pool.
    assert [entry[2] for entry in drv.log] == [2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 12 * MiB, 20 * MiB]


def test_blocks_freed_on_one_stream_are_not_handed_to_another():
    drv = LoggingDriver(64 * MiB, 0)
    cache = CachingAllocator(drv)
    a = cache.malloc(4096, stream=1)
    cache.free(a.addr)
    b = cache.malloc(4096, stream=2)
    c = cache.malloc(4096, stream=1)
    assert (b.addr - BASE, c.addr - BASE) == (2 * MiB, 0)
    assert [(s.addr - BASE, s.stream) for s in cache.snapshot()] == [(0, 1), (2 * MiB, 2)]
    assert drv.log == [("malloc", 0, 2 * MiB), ("malloc", 2 * MiB, 2 * MiB)]


def test_empty_cache_releases_only_wholly_free_segments_and_returns_the_bytes():
    drv = LoggingDriver(64 * MiB, 0)
    cache = CachingAllocator(drv, pad_bytes=0)
    a, b, c = cache.malloc(1 * MiB), cache.malloc(3 * MiB), cache.malloc(18 * MiB)   # c misses b's 17 MiB tail
    cache.free(b.addr)
    cache.free(c.addr)
    assert cache.empty_cache() == 38 * MiB
    assert cache.empty_cache() == 0
    assert (cache.reserved_bytes, cache.segment_count, drv.used_bytes) == (2 * MiB, 1, 2 * MiB)
    cache.free(a.addr)
    assert cache.empty_cache() == 2 * MiB
    assert drv.log == [("malloc", 0, 2 * MiB), ("malloc", 2 * MiB, 20 * MiB), ("malloc", 22 * MiB, 18 * MiB),
                       ("free", 2 * MiB, 20 * MiB), ("free", 22 * MiB, 18 * MiB), ("free", 0, 2 * MiB)]
    assert (cache.reserved_bytes, drv.used_bytes, cache.snapshot()) == (0, 0, [])


def test_a_failed_segment_request_empties_the_cache_and_retries_once():
    drv = LoggingDriver(64 * MiB, 0)
    cache = CachingAllocator(drv, pad_bytes=0)
    for block in [cache.malloc(12 * MiB) for _ in range(5)]:
        cache.free(block.addr)
    big = cache.malloc(20 * MiB)
    assert drv.log == [("malloc", i * 12 * MiB, 12 * MiB) for i in range(5)] + [("oom", 20 * MiB)] + [
        ("free", i * 12 * MiB, 12 * MiB) for i in range(5)] + [("malloc", 0, 20 * MiB)]
    assert (big.addr, cache.retries, cache.reserved_bytes) == (BASE, 1, 20 * MiB)


def test_fragmentation_oom_when_total_free_memory_suffices_but_no_block_does():
    drv = LoggingDriver(64 * MiB, 0)
    cache = CachingAllocator(drv, pad_bytes=0)
    blocks = [cache.malloc(1 * MiB) for _ in range(64)]     # 1 MiB tensors, two per 2 MiB segment
    kept = blocks[::2]
    for block in blocks[1::2]:                   # every other one dies: each segment keeps one tenant
        cache.free(block.addr)
    assert (cache.segment_count, cache.allocated_bytes, cache.reserved_bytes, drv.free_bytes) == (
        32, 32 * MiB, 64 * MiB, 0)
    del drv.log[:]
    with pytest.raises(OutOfMemory) as err:
        cache.malloc(4 * MiB)
    oom = err.value
    assert oom.free_bytes >= oom.requested_bytes > oom.largest_free_bytes
    assert (oom.requested_bytes, oom.free_bytes, oom.largest_free_bytes, oom.reserved_bytes,
            oom.allocated_bytes, oom.stream) == (4 * MiB, 32 * MiB, 1 * MiB, 64 * MiB, 32 * MiB, 0)
    assert str(oom) == (
        "out of device memory: tried to allocate 4.00 MiB on stream 0 (policy HUGE_FIRST); 32.00 MiB free "
        "(0 B in the driver, 32.00 MiB cached), largest free block 1.00 MiB; "
        "caching allocator: 64.00 MiB reserved, 32.00 MiB allocated")
    assert drv.log == [("oom", 20 * MiB), ("oom", 20 * MiB)]      # empty_cache found no free segment
    assert isinstance(oom.__cause__, OutOfMemory)

    for block in kept:                           # the remedy: release the survivors, then it fits
        cache.free(block.addr)
    assert cache.malloc(4 * MiB).addr == BASE
    assert (cache.retries, cache.segment_count, cache.reserved_bytes) == (2, 1, 20 * MiB)


def test_caching_double_free_and_unknown_pointer():
    cache = CachingAllocator(DriverAllocator(16 * MiB, 0))
    a = cache.malloc(1000)
    cache.malloc(1000)
    with pytest.raises(InvalidPointer) as err:
        cache.free(a.addr + 512)                 # inside a block, not its start
    assert str(err.value) == "free of unknown device pointer 0x100000200 (never returned by the caching allocator)"
    cache.free(a.addr)
    with pytest.raises(InvalidPointer, match=r"^double free of device pointer 0x100000000$"):
        cache.free(a.addr)


# --- seeded properties ------------------------------------------------------------------------

def check_driver(drv: DriverAllocator) -> None:
    assert drv.free_bytes + drv.used_bytes == drv.capacity_bytes
    live = drv.live_allocations()
    assert drv.used_bytes == sum(a.bytes for a in live)
    for region in (drv.huge, drv.normal):
        # Live blocks and free blocks tile the region exactly: no overlap, no leak, free list coalesced.
        spans = sorted([(a.addr, a.bytes, True) for a in live if a.huge == (region is drv.huge)]
                       + [(addr, n, False) for addr, n in region.free_blocks()])
        cursor, prev_free = region.start, False
        for addr, n, is_live in spans:
            assert addr == cursor and n > 0
            assert not (prev_free and not is_live), "adjacent free blocks were not merged"
            if is_live:
                assert addr % (drv.page_bytes if region is drv.huge else 64) == 0
            cursor, prev_free = addr + n, not is_live
        assert cursor == region.start + region.capacity_bytes


def check_cache(cache: CachingAllocator, live: dict[int, Allocation]) -> None:
    drv = cache.driver
    assert cache.allocated_bytes <= cache.reserved_bytes <= drv.capacity_bytes
    assert cache.reserved_bytes == drv.used_bytes      # 2 MiB-multiple segments, aclrtMallocAlign32
    assert drv.free_bytes + drv.used_bytes == drv.capacity_bytes
    seen, end = {}, 0
    for seg in cache.snapshot():
        assert seg.addr >= end                          # segments disjoint
        cursor, prev_free = seg.addr, False
        for block in seg.blocks:                        # blocks tile their segment
            assert block.addr == cursor and block.stream == seg.stream
            assert not (prev_free and not block.allocated)
            if block.allocated:
                seen[block.addr] = block.size
            cursor, prev_free = block.addr + block.size, not block.allocated
        assert cursor == seg.addr + seg.bytes
        end = cursor
    assert seen == {addr: a.bytes for addr, a in live.items()}  # every live block inside a segment, nothing else
    assert cache.allocated_bytes == sum(seen.values())


SIZES = [(0.75, 1, 256 * KiB), (0.2, 256 * KiB, 9 * MiB), (0.05, 9 * MiB, 40 * MiB)]


def random_size(rng: random.Random) -> int:
    pick = rng.random()
    for weight, low, high in SIZES:
        if pick < weight:
            return rng.randint(low, high)
        pick -= weight
    return 1


def run_cache(seed: int, ops: int = 3000, check: bool = True) -> list[tuple]:
    rng = random.Random(seed)
    cache = CachingAllocator(DriverAllocator(256 * MiB, 64 * MiB))
    live: dict[int, Allocation] = {}
    log = []
    for _ in range(ops):
        roll = rng.random()
        if roll < 0.02:
            log.append(("empty_cache", cache.empty_cache()))
        elif live and roll < 0.47:
            addr = rng.choice(list(live))
            cache.free(addr)
            del live[addr]
            log.append(("free", addr))
        else:
            size, stream = random_size(rng), rng.randrange(3)
            try:
                alloc = cache.malloc(size, stream)
            except OutOfMemory as oom:
                assert oom.free_bytes >= 0 and oom.largest_free_bytes <= oom.free_bytes
                log.append(("oom", size))
            else:
                assert alloc.addr not in live and alloc.bytes >= alloc.size
                live[alloc.addr] = alloc
                log.append(("malloc", alloc.addr, alloc.bytes))
        if check:
            check_cache(cache, live)
    log.append(("final", cache.snapshot()))
    return log


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_driver_invariants_hold_under_random_malloc_and_free(seed):
    rng = random.Random(seed)
    drv = DriverAllocator(64 * MiB, 16 * MiB)
    live: list[int] = []
    for _ in range(2000):
        if live and rng.random() < 0.45:
            drv.free(live.pop(rng.randrange(len(live))))
        else:
            try:
                live.append(drv.malloc(rng.choice([rng.randint(1, 4096), rng.randint(1, 3 * MiB)]),
                                       rng.choice(list(MallocPolicy))).addr)
            except OutOfMemory:
                pass
        check_driver(drv)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_caching_invariants_hold_under_random_malloc_and_free(seed):
    log = run_cache(seed)
    assert any(entry[0] == "oom" for entry in log) and any(entry[0] == "free" for entry in log)


def test_same_seed_same_layout():
    assert run_cache(11, ops=1500, check=False) == run_cache(11, ops=1500, check=False)
