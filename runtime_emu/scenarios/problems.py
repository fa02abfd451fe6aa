"""Problem switches: the catalogue, and the code that injects each problem into a program.

An injector makes the same runtime calls a program with that mistake makes (a free that never
happens, a copy stream started alongside the input copy, a Python loop of tiny ops...), so the
trace shows the problem the way a real capture would, and records in the run's ProblemLog where
and when it acted and what an analyzer should measure. The structural switches (serial-copies,
missing-sync) change a scenario's stream layout, so the scenario does those itself and only
reports them here. Sizes and durations marked DEFAULT are plausible choices, not measurements.

A report whose problem has a measurable cost carries it as `expected.cost` (`cost_dict`): the
time the run lost to it or the device memory it held, and that cost's share of the device's span
or memory, so the accuracy harness can tell problems worth a warning from minor ones by the
analyzers' own severity rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from runtime_emu.caching import LARGE_SEGMENT_BYTES, round_size
from runtime_emu.device import KERNEL, Kernel, Stream
from runtime_emu.errors import AclError
from runtime_emu.presets import GiB, MiB
from runtime_emu.runtime import MEMCPY_HOST_TO_DEVICE
from runtime_emu.scenarios.scenario import Config, TaskIndex, jittered, task_dict, where

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

SWITCHES: dict[str, str] = {
    "leak": "a buffer allocated every step at one call site and never freed",
    "fragmentation": "interleaved allocation sizes with every other block freed: reserved >> allocated and a "
                     "later large request fails until the cache is emptied",
    "launch-bound": "a per-sample Python loop of tiny kernels (2-10 us), each launched after framework dispatch: "
                    "the device waits for the host",
    "serial-copies": "copies and compute on one stream with a synchronize after every copy: compute bubbles",
    "missing-sync": "the cross-stream event is recorded before the kernel producing a buffer, so the consumer on "
                    "the other stream reads it while it is still being written",
    "queue-congestion": "the host floods a stream that waits on another with short tasks until its queue is full "
                        "and the launch blocks",
    "bandwidth-contention": "a prefetch copy on the same PCIe direction as the input copy, started with it",
}

FRAG_SIZES_BYTES = (6 * MiB, 3 * MiB)  # DEFAULT: two activation sizes that share 20 MiB segments
FRAG_REQUEST_BYTES = 64 * MiB  # DEFAULT: the later large request (bigger than any segment's hole)
DISPATCH_NS = 15_000  # DEFAULT: eager-mode framework cost per op on the host (Python + dispatch)
TINY_OP_NS = (2_000, 10_000)  # tiny kernels: far under the ~50 us merge threshold of DOMAIN.md
FLOOD_QUEUE_TASKS = 320  # every stream's queue in a queue-congestion run (910B: 2013), to keep it short
# DEFAULTS: IsFinite + ReduceAll on ~350 tensors (weights and activations), each check slower than
# a launch, so the queue grows even after its wait is over: 2 x 320 + 64 checks always fill it.
FLOOD_TASKS = 2 * FLOOD_QUEUE_TASKS + 64
FLOOD_KERNEL_NS = (8_000, 12_000)
PREFETCH_BYTES = 16 * MiB  # DEFAULT: a side prefetch (next request's side inputs / weights)
# DEFAULT: what a leaking step keeps, at least, as a share of the device's memory (the buffer and the
# step's activations it refers to, as a loss kept with its graph does; 1 GiB of a 64 GiB card): the few
# steps a profile covers then hold a share worth a warning (3 steps: 4.7%); a scenario's own few-MiB
# buffer would be ~0.03%.
LEAK_SHARE = 1 / 64

#: Preset changes a switch needs to stay small; each problem it records says so.
PRESET_OVERRIDES: dict[str, dict[str, int]] = {
    # DEFAULT: a 1 GiB memory slice (as a vNPU partition would give) so that filling device
    # memory takes ~200 allocations instead of ~13000 on a 64 GiB card.
    "fragmentation": {"hbm_bytes": 1 * GiB, "huge_page_bytes": 512 * MiB},
    # A queue ~700 checks fill (2013 would need ~4100 per step). The checks make the host wait for
    # each step's compute, so the scenarios' own streams then hold at most ~180 tasks.
    "queue-congestion": {"queue_tasks": FLOOD_QUEUE_TASKS},
}


def cost_dict(*, ns: int | None = None, span_ns: int | None = None, nbytes: int | None = None,
              capacity: int | None = None) -> dict[str, Any]:
    """A problem's cost as its report carries it (`expected.cost`): the time the run lost (`ns`)
    and its share of the device's span, or the device memory it held (`bytes`) and its share of
    the device's capacity."""
    if ns is not None:
        return {"ns": int(ns), "share": round(ns / span_ns, 6) if span_ns else None, "of": "device span"}
    return {"bytes": int(nbytes or 0), "share": round((nbytes or 0) / capacity, 6) if capacity else None,
            "of": "device memory"}


def _device_times(tasks: TaskIndex, rank: int, device: int) -> tuple[list[int], list[int], int]:
    """The device's kernels as merged [start, end) spans (starts, ends) and its span from its
    first task's start to its last task's end; computed once per run and device."""
    cache = tasks.__dict__.setdefault("_device_times", {})
    if (rank, device) not in cache:
        mine = [t for t in tasks.by_corr.values() if t.rank == rank and t.device == device]
        starts: list[int] = []
        ends: list[int] = []
        for t in sorted((t for t in mine if t.kind == KERNEL), key=lambda t: t.start_ns):
            if ends and t.start_ns <= ends[-1]:
                ends[-1] = max(ends[-1], t.end_ns)
            else:
                starts.append(t.start_ns)
                ends.append(t.end_ns)
        span = max(t.end_ns for t in mine) - min(t.start_ns for t in mine) if mine else 0
        cache[rank, device] = (starts, ends, span)
    return cache[rank, device]


def kernel_idle_ns(tasks: TaskIndex, rank: int, device: int, start_ns: int, end_ns: int) -> int:
    """Time within [start_ns, end_ns) during which no kernel ran on the device: what a late
    input cost the cores waiting for it."""
    if end_ns <= start_ns:
        return 0
    starts, ends, _ = _device_times(tasks, rank, device)
    busy = sum(min(e, end_ns) - max(s, start_ns) for s, e in zip(starts, ends) if s < end_ns and e > start_ns)
    return end_ns - start_ns - busy


def device_span_ns(tasks: TaskIndex, rank: int, device: int) -> int:
    return _device_times(tasks, rank, device)[2]


class Injector:
    """The problem switches of one run, bound to its runtime and config."""

    def __init__(self, rt: "Runtime", cfg: Config) -> None:
        self.rt = rt
        self.cfg = cfg
        self.log = cfg.problems
        self._live: dict[int, tuple[str, int, Stream, int]] = {}  # ptr -> (site, bytes, stream, ts)
        self._leaked: list[tuple[int, int, int]] = []  # (addr, block bytes, host time of the alloc)
        self._flood: tuple[Stream, Any] | None = None  # the checks' stream and its event
        self._prefetch: tuple[Stream, int, int, Any] | None = None
        self._prefetches: list[int] = []  # corr of every prefetch copy
        self._op_index = 1000  # past the scenarios' graph indices, so names never collide

    def on(self, switch: str) -> bool:
        return self.cfg.on(switch)

    # ------------------------------------------------------------------ leak
    def step_alloc(self, call_site: str, nbytes: int, stream: Stream) -> int:
        """A per-step buffer from the caching allocator (a framework tensor), tagged with its call
        site; with `leak` on, at least LEAK_SHARE of device memory (what the leaking reference keeps alive)."""
        if self.on("leak"):
            nbytes = max(nbytes, int(self.rt.preset.hbm_bytes * LEAK_SHARE))
        ptr = self.rt.cached_malloc(nbytes, stream, tag=call_site)
        self._live[ptr] = (call_site, nbytes, stream, self.rt.now())
        return ptr

    def step_free(self, ptr: int) -> None:
        """Free a per-step buffer, unless `leak` is on: then it stays allocated for good."""
        call_site, nbytes, stream, t_alloc = self._live.pop(ptr)
        if not self.on("leak"):
            self.rt.cached_free(ptr)
            return
        if not self._leaked:
            self.log.add("leak", where=where(stream, call_site=call_site), resolve=self._resolve_leak,
                         detail=f"{call_site} allocates {nbytes} B every step through the caching allocator and "
                                "keeps a reference (the free never happens)")
        self._leaked.append((ptr, round_size(nbytes), t_alloc))

    def _resolve_leak(self, tasks: TaskIndex) -> dict[str, Any]:
        per_step = self._leaked[0][1]
        leaked = per_step * len(self._leaked)
        return {"when": {"start_ns": self._leaked[0][2], "end_ns": self.rt.now()},
                "expected": {"leak_bytes_per_step": per_step, "leaked_allocations": len(self._leaked),
                             "leaked_bytes": leaked, "addresses": [a for a, _, _ in self._leaked],
                             "cost": cost_dict(nbytes=leaked, capacity=self.rt.preset.hbm_bytes)}}

    # ------------------------------------------------------------------ fragmentation
    def fragment(self, stream: Stream, call_site: str) -> None:
        """Fill device memory with interleaved blocks, free every other one, then ask for a big one."""
        if not self.on("fragmentation"):
            return
        rt = self.rt
        driver = stream.device.memory  # stands in for aclrtGetMemInfo, which the runtime lacks
        t0 = rt.now()
        big, small = FRAG_SIZES_BYTES
        ptrs: list[int] = []
        # Each A,B,A,B unit (18 MiB) fits one 20 MiB segment: fill while the driver has one left.
        while driver.largest_free_bytes >= LARGE_SEGMENT_BYTES:
            ptrs.extend(rt.cached_malloc(size, stream, tag=call_site) for size in (big, small, big, small))
        for p in ptrs[::2]:  # the large blocks die, the small ones pin every segment
            rt.cached_free(p)
        cache = stream.device.caching  # stands in for memory_stats(), which the runtime lacks
        reserved, allocated = cache.reserved_bytes, cache.allocated_bytes
        failed = None
        try:
            request = rt.cached_malloc(FRAG_REQUEST_BYTES, stream, tag=call_site)
        except AclError as err:
            # The free memory the request could not use: the driver's, and the cache's holes.
            free = driver.free_bytes + cache.reserved_bytes - cache.allocated_bytes
            failed = {"bytes": FRAG_REQUEST_BYTES, "ts_ns": rt.now(), "error": err.name, "message": str(err),
                      "free_bytes": free}
            request = None
        # What a framework does after catching the OOM: drop the tensors, empty the cache, retry.
        for p in ptrs[1::2]:
            rt.cached_free(p)
        released = rt.empty_cache()
        if request is None:
            request = rt.cached_malloc(FRAG_REQUEST_BYTES, stream, tag=call_site)
        rt.cached_free(request)
        override = PRESET_OVERRIDES["fragmentation"]
        self.log.add(
            "fragmentation", where=where(stream, call_site=call_site), when={"start_ns": t0, "end_ns": rt.now()},
            expected={"reserved_bytes": reserved, "allocated_bytes": allocated,
                      "reserved_minus_allocated_bytes": reserved - allocated, "blocks": len(ptrs),
                      "failed_request": failed, "empty_cache_released_bytes": released, "preset_override": override,
                      "cost": cost_dict(nbytes=failed["free_bytes"] if failed else 0, capacity=rt.preset.hbm_bytes)},
            detail=f"{len(ptrs)} blocks of {big >> 20} and {small >> 20} MiB interleaved, every other freed; "
                   f"a {FRAG_REQUEST_BYTES >> 20} MiB request then "
                   f"{'fails' if failed else 'still succeeds'}; device memory limited to "
                   f"{override['hbm_bytes'] >> 20} MiB for this switch to keep the run short")

    # ------------------------------------------------------------------ launch-bound
    def tiny_ops(self, stream: Stream, ops: list[tuple[str, str]], call_site: str) -> list[int]:
        """Launch (aten name, op type) pairs one by one, each after framework dispatch on the host."""
        if not self.on("launch-bound") or not ops:
            return []
        rt = self.rt
        corrs = []
        for aten, op_type in ops:
            rt.host_work(aten, jittered(rt, DISPATCH_NS, 0.2))
            kernel = Kernel(self._name(op_type), rt.rng.randint(*TINY_OP_NS), core="vector", op_type=op_type)
            corrs.append(rt.launch_kernel(kernel, rt.rng.choice((1, 2, 4, 8)), stream))

        def resolve(tasks: TaskIndex) -> dict[str, Any]:
            ks = [tasks[c] for c in corrs]
            start, end = ks[0].start_ns, max(k.end_ns for k in ks)
            durs = sorted(k.end_ns - k.start_ns for k in ks)
            busy = tasks.busy_ns(ks[0].rank, ks[0].device, start, end)
            return {"when": {"start_ns": start, "end_ns": end},
                    "expected": {"kernels": len(ks), "max_kernel_ns": durs[-1], "median_kernel_ns": durs[len(durs) // 2],
                                 "device_idle_fraction": round(1 - busy / (end - start), 4),
                                 "launch_interval_ns": (ks[-1].start_ns - start) // max(1, len(ks) - 1)}}

        self.log.add("launch-bound", where=where(stream, call_site=call_site), resolve=resolve,
                     detail=f"{len(ops)} tiny kernels ({TINY_OP_NS[0] // 1000}-{TINY_OP_NS[1] // 1000} us) launched one "
                            f"by one, each after ~{DISPATCH_NS // 1000} us of framework dispatch")
        return corrs

    def _name(self, op_type: str) -> str:
        # torch_npu names kernels by op type and a running index ("Cast66", "Slice67").
        self._op_index += 1
        return f"{op_type}{self._op_index}"

    # ------------------------------------------------------------------ queue congestion
    def flood(self, after: Stream, call_site: str, tasks: int = FLOOD_TASKS) -> None:
        """Check every tensor of the step on a side stream: the checks wait for `after`'s work so
        far, and the host queues them faster than they can start."""
        if not self.on("queue-congestion"):
            return
        rt = self.rt
        if self._flood is None:
            self._flood = (rt.create_stream(), rt.create_event())
        stream, ready = self._flood
        rt.record_event(ready, after)
        rt.stream_wait_event(stream, ready)
        overhead = rt.preset.launch_overhead_ns
        blocked = []
        for k in range(tasks):
            t0 = rt.now()
            # One IsFinite and one ReduceAll per tensor, as an overflow-check hook launches them.
            op = "ReduceAll" if k % 2 else "IsFinite"
            kernel = Kernel(self._name(op), rt.rng.randint(*FLOOD_KERNEL_NS), core="vector", op_type=op)
            rt.launch_kernel(kernel, 1, stream)
            t1 = rt.now()
            if t1 - t0 > overhead:
                blocked.append((t0, t1, t1 - t0 - overhead))
        if not blocked:
            return
        queue = rt.preset.queue_tasks
        self.log.add(
            "queue-congestion", where=where(stream, call_site=call_site, api="aclrtLaunchKernel"),
            when={"start_ns": blocked[0][0], "end_ns": blocked[-1][1]},
            expected={"queue_tasks": queue, "max_queue_depth": queue, "blocked_launches": len(blocked),
                      "blocked_ns": sum(b[2] for b in blocked), "max_blocked_ns": max(b[2] for b in blocked),
                      "preset_override": PRESET_OVERRIDES["queue-congestion"]},
            detail=f"{tasks} overflow checks queued on stream {stream.id} behind a wait for stream {after.id}; the "
                   f"queue fills and the launch blocks. Every stream's queue holds {queue} tasks in this run "
                   f"(910B: 2013), lowered to keep the run short; the model's streams stay far below it")

    # ------------------------------------------------------------------ bandwidth contention
    def contend(self, victim: Stream, nbytes: int) -> Callable[[int], None]:
        """Start a prefetch copy on the H2D link exactly when `victim`'s next task starts.

        Call it right before launching the `nbytes` victim copy on `victim`, then call the
        returned function with the victim copy's correlation id.
        """
        if not self.on("bandwidth-contention"):
            return lambda corr: None
        rt = self.rt
        if self._prefetch is None:
            self._prefetch = (rt.create_stream(), rt.malloc_host(PREFETCH_BYTES), rt.malloc(PREFETCH_BYTES),
                              rt.create_event())
        stream, host, dev, ev = self._prefetch
        # The prefetcher starts at the input copy's place in stream order (a common way to
        # "overlap" copies that in fact share one PCIe direction).
        rt.record_event(ev, victim)
        rt.stream_wait_event(stream, ev)
        self._prefetches.append(rt.memcpy_async(dev, PREFETCH_BYTES, host, PREFETCH_BYTES, MEMCPY_HOST_TO_DEVICE,
                                                stream))
        preset = rt.preset
        link = f"r{victim.device.rank}.d{victim.device.id}.pcie_h2d"

        def report(corr: int) -> None:
            def resolve(tasks: TaskIndex) -> dict[str, Any]:
                v = tasks[corr]
                # Back-to-back input copies can meet an earlier prefetch rather than their own.
                rivals = [p for p in map(tasks.__getitem__, self._prefetches)
                          if p.start_ns < v.end_ns and p.end_ns > v.start_ns]
                alone = preset.copy_latency_ns + round(nbytes / preset.pcie_gbps)
                actual = v.end_ns - v.start_ns
                # What the run would get back: the part of the input copy's overhang past its
                # alone time during which the cores had no kernel to run (they waited for it).
                lost = kernel_idle_ns(tasks, v.rank, v.device, v.start_ns + alone, v.end_ns) if rivals else 0
                when = ({"start_ns": max(v.start_ns, min(p.start_ns for p in rivals)),
                         "end_ns": min(v.end_ns, max(p.end_ns for p in rivals))} if rivals
                        else {"start_ns": v.start_ns, "end_ns": v.end_ns})
                return {"when": when,
                        "expected": {"link": link, "victim": {**task_dict(v), "bytes": nbytes},
                                     "competing": [{**task_dict(p), "bytes": PREFETCH_BYTES} for p in rivals],
                                     "alone_ns": alone, "actual_ns": actual, "slowdown": round(actual / alone, 3),
                                     "manifested": bool(rivals),
                                     "cost": cost_dict(ns=lost, span_ns=device_span_ns(tasks, v.rank, v.device))}}

            self.log.add("bandwidth-contention", where=where(victim, link=link), resolve=resolve,
                         detail=f"a {PREFETCH_BYTES >> 20} MiB H2D prefetch on stream {stream.id} shares {link} with "
                                "the input copy")

        return report

    # ------------------------------------------------------------------ structural switches (reports only)
    def report_missing_sync(self, producer: int, consumer: int, consumer_stream: Stream, buffer: str) -> None:
        """A consumer on another stream that no event orders after the kernel producing `buffer`."""

        def resolve(tasks: TaskIndex) -> dict[str, Any]:
            p, c = tasks[producer], tasks[consumer]
            both = {"start_ns": max(p.start_ns, c.start_ns), "end_ns": min(p.end_ns, c.end_ns)}
            return {"when": {"start_ns": c.start_ns, "end_ns": max(c.start_ns, p.end_ns)},
                    "expected": {"producer": task_dict(p), "consumer": task_dict(c),
                                 "early_ns": p.end_ns - c.start_ns, "overlap": both,
                                 "manifested": c.start_ns < p.end_ns}}

        self.log.add("missing-sync", where=where(consumer_stream, buffer=buffer), resolve=resolve,
                     detail=f"the event the consumer waits for is recorded before the kernel that writes {buffer}; "
                            "no event orders the consumer after that producer")

    def report_serial_bubble(self, stream: Stream, prev_kernel: int | None, next_kernel: int, copies: list[int],
                             call_site: str) -> None:
        """Compute on `stream` stopped from `prev_kernel` to `next_kernel` while copies ran and the host synced.

        With no kernel before (the first step's input copy), the bubble is the pipeline fill a
        double-buffered program pays as well: not a problem, so not recorded."""
        if prev_kernel is None:
            return

        def resolve(tasks: TaskIndex) -> dict[str, Any]:
            cs = [tasks[c] for c in copies]
            start = tasks[prev_kernel].end_ns if prev_kernel is not None else min(c.start_ns for c in cs)
            end = tasks[next_kernel].start_ns
            return {"when": {"start_ns": start, "end_ns": end},
                    "expected": {"bubble_ns": end - start, "copy_ns": sum(c.end_ns - c.start_ns for c in cs),
                                 "copies": [task_dict(c) for c in cs]}}

        self.log.add("serial-copies", where=where(stream, call_site=call_site), resolve=resolve,
                     detail="copies and compute share one stream and the host synchronizes after each copy, so "
                            "nothing is queued behind the copy")
