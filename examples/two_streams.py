"""An AscendCL-style program on the emulated runtime: copy in, compute on two streams joined by
an event, copy out, synchronize. Run it directly (`python examples/two_streams.py [OUT_DIR]`) to
write its trace, or capture it with msprof-py.

    stream A:  H2D copy -> matmul -> record(ev)
    stream B:                         wait(ev) -> softmax -> D2H copy
"""

from __future__ import annotations

import sys
from pathlib import Path

from runtime_emu import Kernel, acl

MiB = 1 << 20


def main(steps: int = 3) -> None:
    acl.init(seed=0)
    acl.rt.set_device(0)
    stream_a = acl.rt.create_stream()
    stream_b = acl.rt.create_stream()
    ready = acl.rt.create_event()

    size = 8 * MiB
    host_in = acl.rt.malloc_host(size)  # pinned: copies from it are asynchronous
    host_out = acl.rt.malloc_host(size)
    dev_in = acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    dev_out = acl.rt.malloc(size, acl.ACL_MEM_MALLOC_HUGE_FIRST)

    matmul = Kernel("MatMul", block_ns=40_000, core="cube")
    softmax = Kernel("SoftmaxV2", block_ns=8_000, core="vector")

    for _ in range(steps):
        with acl.prof.step():
            acl.prof.host_work("preprocess", 150_000)
            acl.rt.memcpy_async(dev_in, size, host_in, size, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream_a)
            acl.rt.launch_kernel(matmul, 24, stream_a)  # 24 blocks on 20 cores: a partial second wave
            acl.rt.record_event(ready, stream_a)
            acl.rt.stream_wait_event(stream_b, ready)
            acl.rt.launch_kernel(softmax, 40, stream_b)
            acl.rt.memcpy_async(host_out, size, dev_out, size, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream_b)
            acl.rt.synchronize_stream(stream_b)

    acl.rt.free(dev_in)
    acl.rt.free(dev_out)
    acl.rt.free_host(host_in)
    acl.rt.free_host(host_out)
    result = acl.finalize()
    if len(sys.argv) > 1:
        from msprof_py.trace import write_trace

        out = Path(sys.argv[1])
        out.mkdir(parents=True, exist_ok=True)
        write_trace(result.trace, out / "trace.parquet")
        print(f"wrote {len(result.trace)} events to {out / 'trace.parquet'}")


if __name__ == "__main__":
    main()
