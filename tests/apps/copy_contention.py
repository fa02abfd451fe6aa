"""The double-buffered inference pipeline plus a side transfer that competes for the PCIe link.

The input pipeline alone is hidden: copying the next 8 MiB batch takes less time than computing
the current one (double_buffer.py is the same program without the side transfer). From the second step on, the program also swaps 8 MiB of
offloaded embedding rows in on a separate stream every step. Both host-to-device copies cross
the same PCIe link at the same time, each gets half the bandwidth, and the next batch is no
longer there when the compute stream wants it.
"""

from runtime_emu import Kernel, acl

MiB = 1 << 20
STEPS = 10
IN_BYTES = 8 * MiB
SWAP_BYTES = 8 * MiB
OUT_BYTES = 1 * MiB

conv = Kernel("Conv2D", block_ns=80_000, core="cube")
act = Kernel("Relu", block_ns=10_000, core="vector")


def main() -> None:
    acl.init(seed=0)
    acl.rt.set_device(0)
    copy_s = acl.rt.create_stream()
    compute_s = acl.rt.create_stream()
    out_s = acl.rt.create_stream()
    swap_s = acl.rt.create_stream()
    host_in = acl.rt.malloc_host(IN_BYTES)
    host_out = acl.rt.malloc_host(OUT_BYTES)
    host_rows = acl.rt.malloc_host(SWAP_BYTES)
    dev_in = [acl.rt.malloc(IN_BYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST) for _ in range(2)]
    dev_out = [acl.rt.malloc(OUT_BYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST) for _ in range(2)]
    dev_rows = acl.rt.malloc(SWAP_BYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    loaded = [acl.rt.create_event() for _ in range(2)]
    consumed = [acl.rt.create_event() for _ in range(2)]
    computed = [acl.rt.create_event() for _ in range(2)]
    returned = [acl.rt.create_event() for _ in range(2)]
    for i in range(STEPS):
        b = i % 2
        with acl.prof.step():
            if i >= 2:
                acl.rt.stream_wait_event(copy_s, consumed[b])
            acl.rt.memcpy_async(dev_in[b], IN_BYTES, host_in, IN_BYTES, acl.ACL_MEMCPY_HOST_TO_DEVICE, copy_s)
            acl.rt.record_event(loaded[b], copy_s)
            acl.rt.stream_wait_event(compute_s, loaded[b])
            for _ in range(5):
                acl.rt.launch_kernel(conv, 20, compute_s)
                acl.rt.launch_kernel(act, 40, compute_s)
            acl.rt.record_event(consumed[b], compute_s)
            acl.rt.record_event(computed[b], compute_s)
            acl.rt.stream_wait_event(out_s, computed[b])
            acl.rt.memcpy_async(host_out, OUT_BYTES, dev_out[b], OUT_BYTES, acl.ACL_MEMCPY_DEVICE_TO_HOST, out_s)
            acl.rt.record_event(returned[b], out_s)
            if 1 <= i < STEPS - 1:
                # embedding rows for later batches, swapped in while the pipeline runs
                acl.rt.memcpy_async(dev_rows, SWAP_BYTES, host_rows, SWAP_BYTES, acl.ACL_MEMCPY_HOST_TO_DEVICE,
                                    swap_s)
            if i >= 1:
                acl.rt.synchronize_event(returned[1 - b])
    acl.rt.synchronize_device()
    for ptr in dev_in + dev_out + [dev_rows]:
        acl.rt.free(ptr)
    for ptr in (host_in, host_out, host_rows):
        acl.rt.free_host(ptr)
    acl.finalize()


if __name__ == "__main__":
    main()
