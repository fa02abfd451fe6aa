"""Image inference where JPEG decoding and resizing run on the host before every batch.

Per batch the host decodes (1.2 ms) and resizes (0.5 ms) the images, copies them in, runs the
network (about 1 ms on the device), copies the detections out and waits for them. The device
is idle while the host preprocesses.
"""

from runtime_emu import Kernel, acl

MiB = 1 << 20
STEPS = 10
IN_BYTES = 2 * MiB
OUT_BYTES = 256 * 1024

conv = Kernel("Conv2D", block_ns=100_000, core="cube")
head = Kernel("DetectHead", block_ns=40_000, core="vector")


def main() -> None:
    acl.init(seed=0)
    acl.rt.set_device(0)
    stream = acl.rt.create_stream()
    host_in = acl.rt.malloc_host(IN_BYTES)
    host_out = acl.rt.malloc_host(OUT_BYTES)
    dev_in = acl.rt.malloc(IN_BYTES)
    dev_out = acl.rt.malloc(OUT_BYTES)
    for _ in range(STEPS):
        with acl.prof.step():
            acl.prof.host_work("decode_jpeg", 1_200_000)
            acl.prof.host_work("resize", 500_000)
            acl.rt.memcpy_async(dev_in, IN_BYTES, host_in, IN_BYTES, acl.ACL_MEMCPY_HOST_TO_DEVICE, stream)
            for _ in range(9):
                acl.rt.launch_kernel(conv, 20, stream)
            acl.rt.launch_kernel(head, 40, stream)
            acl.rt.memcpy_async(host_out, OUT_BYTES, dev_out, OUT_BYTES, acl.ACL_MEMCPY_DEVICE_TO_HOST, stream)
            acl.rt.synchronize_stream(stream)
    acl.rt.free(dev_in)
    acl.rt.free(dev_out)
    acl.rt.free_host(host_in)
    acl.rt.free_host(host_out)
    acl.finalize()


if __name__ == "__main__":
    main()
