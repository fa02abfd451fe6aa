"""Two-stream pipeline that forgot the event between producer and consumer.

The producer kernel on stream A writes a feature map; the consumer kernel on stream B reads it.
There is no record_event / stream_wait_event between them, so the consumer starts while the
producer is still writing (a race: sometimes wrong results, never an error).
"""

from runtime_emu import Kernel, acl

MiB = 1 << 20
STEPS = 6

producer = Kernel("Encoder", block_ns=200_000, core="cube")
consumer = Kernel("Decoder", block_ns=150_000, core="vector")


def main() -> None:
    acl.init(seed=0)
    acl.rt.set_device(0)
    stream_a = acl.rt.create_stream()
    stream_b = acl.rt.create_stream()
    features = acl.rt.malloc(16 * MiB)
    inputs = acl.rt.malloc(16 * MiB)
    outputs = acl.rt.malloc(16 * MiB)
    for _ in range(STEPS):
        with acl.prof.step():
            acl.rt.launch_kernel(producer, 20, stream_a, reads=(inputs,), writes=(features,))
            acl.rt.launch_kernel(consumer, 40, stream_b, reads=(features,), writes=(outputs,))  # no wait!
            acl.rt.synchronize_device()
    for ptr in (features, inputs, outputs):
        acl.rt.free(ptr)
    acl.finalize()


if __name__ == "__main__":
    main()
