"""Inference on one stream: copy the batch in, compute, copy the result out, wait.

Everything goes on a single stream, so the 8 MiB input copy of each batch runs while no kernel
can: the AI Cores sit idle for the length of every copy.
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
    stream = acl.rt.create_stream()
    host_in = acl.rt.malloc_host(IN_BYTES)
    host_out = acl.rt.malloc_host(OUT_BYTES)
    dev_in = acl.rt.malloc(IN_BYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    dev_out = acl.rt.malloc(OUT_BYTES, acl.ACL_MEM_MALLOC_HUGE_FIRST)
    for _ in range(STEPS):
        with acl.prof.step():
            acl.rt.memcpy_async(dev_in, IN_BYTES, host_in, IN_BYTES, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream)
            for _ in range(5):
                acl.rt.launch_kernel(conv, 20, stream)
                acl.rt.launch_kernel(act, 40, stream)
            acl.rt.memcpy_async(host_out, OUT_BYTES, dev_out, OUT_BYTES, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream)
            acl.rt.synchronize_stream(stream)
    acl.rt.free(dev_in)
    acl.rt.free(dev_out)
    acl.rt.free_host(host_in)
    acl.rt.free_host(host_out)
    acl.finalize()


if __name__ == "__main__":
    main()
