"""The serial-copy inference rewritten with double buffering (healthy).

Two input buffers; a copy stream loads batch i+1 while the compute stream works on batch i.
Events order the two: compute waits for its batch's copy, and a copy into a buffer waits until
the compute that read the buffer's previous batch is done. Results go out on a third stream.
The host waits for batch i-1's result while batch i is in flight, so it never runs far ahead.
Only the first copy (pipeline fill) and the last result copy (drain) leave the cores idle.
"""

from runtime_emu import Kernel, acl

MiB = 1 << 20
STEPS = 10
IN_BYTES = 8 * MiB
OUT_BYTES = 1 * MiB

conv = Kernel("Conv2D", block_ns=80_000, core="cube")
act = Kernel("Relu", block_ns=10_000, core="vector")


def main() -> None:
    acl.init(seed=0)
    acl.rt.set_device(0)
    copy_s = acl.rt.create_stream()
    compute_s = acl.rt.create_stream()
    out_s = acl.rt.create_stream()
    host_in = acl.rt.malloc_host(IN_BYTES)
    host_out = acl.rt.malloc_host(OUT_BYTES)
    dev_in = [acl.rt.malloc(IN_BYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST) for _ in range(2)]
    dev_out = [acl.rt.malloc(OUT_BYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST) for _ in range(2)]
    loaded = [acl.rt.create_event() for _ in range(2)]
    consumed = [acl.rt.create_event() for _ in range(2)]
    computed = [acl.rt.create_event() for _ in range(2)]
    returned = [acl.rt.create_event() for _ in range(2)]
    for i in range(STEPS):
        b = i % 2
        with acl.prof.step():
            if i >= 2:
                acl.rt.stream_wait_event(copy_s, consumed[b])  # buffer b is free again
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
            if i >= 1:
                acl.rt.synchronize_event(returned[1 - b])  # result of batch i-1
    acl.rt.synchronize_device()
    for ptr in dev_in + dev_out:
        acl.rt.free(ptr)
    acl.rt.free_host(host_in)
    acl.rt.free_host(host_out)
    acl.finalize()


if __name__ == "__main__":
    main()
