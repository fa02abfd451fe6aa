"""A well-behaved single-NPU training loop (healthy).

Three streams: the data stream prefetches the next batch while the compute stream runs forward
and backward of the current one, and a side stream runs the optimizer's vector work for the
previous step's parameters while the next forward starts (events keep every dependency). The
host bounds its run-ahead by waiting for the step before last, and reads the loss with a small
copy. The cores are busy all the time except the pipeline fill and drain.
"""

from runtime_emu import Kernel, acl

MiB = 1 << 20
STEPS = 8
BATCH_BYTES = 4 * MiB

embed = Kernel("Embedding", block_ns=30_000, core="vector")
matmul = Kernel("MatMul", block_ns=80_000, core="cube")
grad = Kernel("MatMulGrad", block_ns=90_000, core="cube")
adam = Kernel("AdamW", block_ns=30_000, core="vector")


def main() -> None:
    acl.init(seed=0)
    acl.rt.set_device(0)
    data_s = acl.rt.create_stream()
    compute_s = acl.rt.create_stream()
    optim_s = acl.rt.create_stream()
    host_batch = acl.rt.malloc_host(BATCH_BYTES)
    host_loss = acl.rt.malloc_host(4096)
    batches = [acl.caching.malloc(BATCH_BYTES, data_s) for _ in range(2)]
    loss = acl.caching.malloc(4096, compute_s)
    loaded = [acl.rt.create_event() for _ in range(2)]
    used = [acl.rt.create_event() for _ in range(2)]
    grads_ready = acl.rt.create_event()
    done = [acl.rt.create_event() for _ in range(2)]

    def load(i: int) -> None:
        b = i % 2
        if i >= 2:
            acl.rt.stream_wait_event(data_s, used[b])
        acl.rt.memcpy_async(batches[b], BATCH_BYTES, host_batch, BATCH_BYTES, acl.ACL_MEMCPY_HOST_TO_DEVICE, data_s)
        acl.rt.record_event(loaded[b], data_s)

    load(0)
    for i in range(STEPS):
        b = i % 2
        with acl.prof.step():
            if i + 1 < STEPS:
                load(i + 1)
            acl.rt.stream_wait_event(compute_s, loaded[b])
            acl.rt.launch_kernel(embed, 40, compute_s)
            for _ in range(3):
                acl.rt.launch_kernel(matmul, 20, compute_s)
            acl.rt.record_event(used[b], compute_s)
            for _ in range(3):
                acl.rt.launch_kernel(grad, 20, compute_s)
            acl.rt.record_event(grads_ready, compute_s)
            acl.rt.memcpy_async(host_loss, 4096, loss, 4096, acl.ACL_MEMCPY_DEVICE_TO_HOST, compute_s)
            acl.rt.stream_wait_event(optim_s, grads_ready)
            acl.rt.launch_kernel(adam, 40, optim_s)
            acl.rt.record_event(done[b], optim_s)
            if i >= 1:
                acl.rt.synchronize_event(done[1 - b])  # step i-1 finished: log its loss
    acl.rt.synchronize_device()
    for ptr in batches + [loss]:
        acl.caching.free(ptr)
    acl.rt.free_host(host_batch)
    acl.rt.free_host(host_loss)
    acl.finalize()


if __name__ == "__main__":
    main()
