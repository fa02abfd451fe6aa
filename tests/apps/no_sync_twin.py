"""The sync-after-every-kernel program without the per-kernel syncs (healthy): the same kernels,
one synchronize at the end of each step, so the host queues ahead and the device runs them
back to back.
"""

from runtime_emu import Kernel, acl

STEPS = 8
LAYERS = 24

matmul = Kernel("MatMul", block_ns=20_000, core="cube")
gelu = Kernel("Gelu", block_ns=6_000, core="vector")


def main() -> None:
    acl.init(seed=0)
    acl.rt.set_device(0)
    stream = acl.rt.create_stream()
    for _ in range(STEPS):
        with acl.prof.step():
            for _ in range(LAYERS):
                acl.rt.launch_kernel(matmul, 20, stream)
                acl.rt.launch_kernel(gelu, 40, stream)
            acl.rt.synchronize_stream(stream)
    acl.finalize()


if __name__ == "__main__":
    main()
