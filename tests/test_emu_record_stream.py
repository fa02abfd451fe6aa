"""record_stream in the emulator's caching allocator (Tensor.record_stream): a block another stream
used goes back to the cache only once that stream's work queued before the free is done, so the
standard fix for cross-stream reuse can be written and checked."""

from __future__ import annotations

import pytest

from runtime_emu import AclError, Kernel, Runtime, acl
from runtime_emu.caching import CachingAllocator
from runtime_emu.memory import DriverAllocator, MiB

SLOW = Kernel("consumer", block_ns=1_000_000)  # 1 ms per block: still running when the host frees


def _reuse(record: bool) -> tuple[int, int, Runtime]:
    """A producer stream allocates a buffer, a consumer stream reads it in a long kernel, the host
    frees it at once and allocates the same size again on the producer stream."""
    rt = Runtime(seed=0)
    rt.set_device(0)
    producer, consumer = rt.create_stream(), rt.create_stream()
    buf = rt.cached_malloc(4 * MiB, producer)
    rt.launch_kernel(SLOW, 4, consumer)  # reads buf for 1 ms
    if record:
        rt.record_stream(buf, consumer)
    rt.cached_free(buf)
    again = rt.cached_malloc(4 * MiB, producer)
    return buf, again, rt


def test_without_record_stream_the_block_is_handed_out_while_the_other_stream_still_reads_it():
    buf, again, rt = _reuse(record=False)
    assert again == buf
    rt.finish()


def test_record_stream_keeps_the_block_until_the_other_stream_is_done():
    buf, again, rt = _reuse(record=True)
    assert again != buf  # the reader is still running: a new block
    cache = rt.devices[(0, 0)].caching
    # Allocated drops at the free (as PyTorch's stats); the block stays reserved, pending.
    assert cache.allocated_bytes == round_4mib(cache) and cache.process_pending() == 1
    rt.synchronize_device()
    assert cache.process_pending() == 0  # the consumer finished: the block is back in the cache
    result = rt.finish()
    # The allocator recorded an event on the consumer stream at the free, as torch_npu's does.
    df = result.trace.to_pandas()
    records = df[(df["name"] == "aclrtRecordEvent")]
    assert len(records) == 1
    tasks = df[df["name"] == "EVENT_RECORD"]
    assert len(tasks) == 1 and int(tasks["stream"].iloc[0]) == int(df[df["name"] == "consumer"]["stream"].iloc[0])


def round_4mib(cache: CachingAllocator) -> int:
    from runtime_emu.caching import round_size

    return round_size(4 * MiB, cache.pad_bytes)


def test_a_recorded_block_is_reused_once_its_stream_finished():
    rt = Runtime(seed=0)
    rt.set_device(0)
    producer, consumer = rt.create_stream(), rt.create_stream()
    buf = rt.cached_malloc(4 * MiB, producer)
    rt.launch_kernel(SLOW, 4, consumer)
    rt.record_stream(buf, consumer)
    rt.cached_free(buf)
    rt.synchronize_stream(consumer)
    assert rt.cached_malloc(4 * MiB, producer) == buf
    rt.finish()


def test_the_allocator_waits_for_every_recorded_stream_and_merges_after():
    done = {"a": False, "b": False}
    cache = CachingAllocator(DriverAllocator(64 * MiB, huge_bytes=0), pad_bytes=0)
    x = cache.malloc(1 * MiB, stream=0)
    y = cache.malloc(1 * MiB, stream=0)
    cache.record_stream(x.addr, 1)
    cache.record_stream(x.addr, 2)
    cache.record_stream(x.addr, 0)  # its own stream: nothing to wait for
    asked = []

    def wait_for(streams):
        asked.append(streams)
        return lambda: all(done.values())

    cache.free(x.addr, wait_for)
    assert asked == [frozenset({1, 2})] and cache.allocated_bytes == 1 * MiB
    cache.free(y.addr)  # not merged with the pending block beside it
    assert [b.allocated for s in cache.snapshot() for b in s.blocks][:2] == [False, False]
    assert cache.malloc(1 * MiB, stream=0).addr == y.addr  # x is not handed out
    cache.free(y.addr)
    done["a"] = True
    assert cache.process_pending() == 1
    done["b"] = True
    assert cache.empty_cache() == 2 * MiB and cache.reserved_bytes == 0  # merged back whole, released


def test_record_stream_on_a_pointer_it_does_not_hold_is_an_error():
    rt = Runtime(seed=0)
    rt.set_device(0)
    s = rt.create_stream()
    buf = rt.cached_malloc(1 * MiB, s)
    rt.cached_free(buf)
    with pytest.raises(AclError, match="ACL_ERROR_INVALID_PARAM"):
        rt.record_stream(buf, s)
    with pytest.raises(AclError):
        acl.caching.record_stream(12345, s)
    rt.finish()
