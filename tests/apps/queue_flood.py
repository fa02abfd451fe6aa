"""A batch job that launches a whole epoch of work onto one stream without ever waiting.

4,000 kernels of 50 us each go to one stream as fast as the host can launch them (5 us each).
The stream's task queue holds about 2,000 tasks; once it is full every further launch blocks
until a task retires, so the host thread spends most of its time stuck inside launch calls.
"""

from runtime_emu import Kernel, acl

TASKS = 4_000

layer = Kernel("FusedLayer", block_ns=50_000, core="cube")


def main() -> None:
    acl.init(seed=0)
    acl.rt.set_device(0)
    stream = acl.rt.create_stream()
    with acl.prof.step():
        for _ in range(TASKS):
            acl.rt.launch_kernel(layer, 20, stream)
        acl.rt.synchronize_stream(stream)
    acl.finalize()


if __name__ == "__main__":
    main()
