"""Eager-mode model made of many tiny element-wise ops, dispatched one by one from Python.

Each op costs a few microseconds of Python/operator dispatch on the host plus the launch
itself, while the kernel runs for only 2-5 us: the device finishes each kernel long before
the host has launched the next one.
"""

from runtime_emu import Kernel, acl

STEPS = 5
OPS = 300

ops = [Kernel("Add", block_ns=2_000, core="vector"), Kernel("Mul", block_ns=3_000, core="vector"),
       Kernel("Cast", block_ns=4_000, core="vector"), Kernel("LayerNorm", block_ns=5_000, core="vector")]


def main() -> None:
    acl.init(seed=0)
    acl.rt.set_device(0)
    stream = acl.rt.create_stream()
    for _ in range(STEPS):
        with acl.prof.step():
            for i in range(OPS):
                acl.prof.host_work("op_dispatch", 4_000)
                acl.rt.launch_kernel(ops[i % len(ops)], 40, stream)
            acl.rt.synchronize_stream(stream)
    acl.finalize()


if __name__ == "__main__":
    main()
