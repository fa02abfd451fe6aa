"""Training loop that keeps every step's output buffer alive by accident.

Activations are allocated through the caching allocator and freed each step, but the buffer
holding the step's outputs (the logits: batch x sequence x vocabulary) is appended to a history
list "for logging" and never freed: 512 MiB more device memory is held after every step, 10 GiB
over the 20 steps (15.6% of the device's 64 GiB).
"""

from runtime_emu import Kernel, acl

MiB = 1 << 20
STEPS = 20
ACT_BYTES = 32 * MiB
KEPT_BYTES = 512 * MiB

fwd = Kernel("Forward", block_ns=40_000, core="cube")
bwd = Kernel("Backward", block_ns=80_000, core="cube")


def main() -> None:
    acl.init(seed=0)
    acl.rt.set_device(0)
    stream = acl.rt.create_stream()
    weights = acl.caching.malloc(64 * MiB, stream)
    history = []
    for _ in range(STEPS):
        with acl.prof.step():
            act = acl.caching.malloc(ACT_BYTES, stream)
            out = acl.caching.malloc(KEPT_BYTES, stream)
            acl.rt.launch_kernel(fwd, 20, stream)
            acl.rt.launch_kernel(bwd, 20, stream)
            acl.rt.synchronize_stream(stream)
            acl.caching.free(act)
            history.append(out)  # the leak: never freed
    acl.caching.free(weights)
    acl.finalize()


if __name__ == "__main__":
    main()
