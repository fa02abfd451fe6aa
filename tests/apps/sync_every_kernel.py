"""A debugging habit left in: synchronize the stream after every kernel launch.

Each launch is followed by aclrtSynchronizeStream, so the host cannot submit the next kernel
until the previous one has finished: the device sits idle between every pair of kernels.
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
                acl.rt.synchronize_stream(stream)
                acl.rt.launch_kernel(gelu, 40, stream)
                acl.rt.synchronize_stream(stream)
    acl.finalize()


if __name__ == "__main__":
    main()
