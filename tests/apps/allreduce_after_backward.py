"""Data-parallel training on 4 NPUs that reduces its gradients only after the whole backward.

Every rank runs the same step: forward, then backward layer by layer; once the backward has
finished (one event on the compute stream) each gradient bucket is all-reduced on a communication
stream, one after another, while the compute stream has nothing left to do but wait for them
before the optimizer. The problem: the all-reduces could run under the backward of the buckets
after theirs (`healthy_allreduce.py` does that), here the cores idle through all of them.
"""

from runtime_emu import Kernel, acl, hccl, topology

MiB = 1 << 20
RANKS = 4
STEPS = 6
BUCKETS = 4
BUCKET_BYTES = 4 * MiB
BATCH_BYTES = 2 * MiB

forward = Kernel("Forward", block_ns=70_000, core="cube")
backward = Kernel("Backward", block_ns=140_000, core="cube")
optimizer = Kernel("AdamW", block_ns=20_000, core="vector")


def train(rank: int) -> None:
    acl.rt.set_device(rank % RANKS)
    comm = hccl.comm_init_all()
    compute = acl.rt.create_stream()
    comm_s = acl.rt.create_stream()
    data_s = acl.rt.create_stream()
    host_batch = acl.rt.malloc_host(BATCH_BYTES)
    batches = [acl.rt.malloc(BATCH_BYTES) for _ in range(2)]
    loaded = [acl.rt.create_event() for _ in range(2)]
    grads = [acl.rt.malloc(BUCKET_BYTES) for _ in range(BUCKETS)]
    backward_done = acl.rt.create_event()
    reduced = acl.rt.create_event()

    def load(i: int) -> None:
        acl.prof.host_work("load_batch", 100_000)
        acl.rt.memcpy_async(batches[i % 2], BATCH_BYTES, host_batch, BATCH_BYTES, acl.ACL_MEMCPY_HOST_TO_DEVICE,
                            data_s)
        acl.rt.record_event(loaded[i % 2], data_s)

    load(0)
    for i in range(STEPS):
        with acl.prof.step():
            acl.rt.stream_wait_event(compute, loaded[i % 2])
            for _ in range(BUCKETS):
                acl.rt.launch_kernel(forward, 20, compute)
            for _ in range(BUCKETS):
                acl.rt.launch_kernel(backward, 20, compute)
            acl.rt.record_event(backward_done, compute)
            acl.rt.stream_wait_event(comm_s, backward_done)
            for k in range(BUCKETS):
                hccl.all_reduce(grads[k], grads[k], BUCKET_BYTES // 2, hccl.HCCL_DATA_TYPE_FP16,
                                hccl.HCCL_REDUCE_SUM, comm, comm_s)
            acl.rt.record_event(reduced, comm_s)
            acl.rt.stream_wait_event(compute, reduced)
            acl.rt.launch_kernel(optimizer, 40, compute)
            if i + 1 < STEPS:
                load(i + 1)  # the next batch, while this step runs
            acl.rt.synchronize_stream(compute)
    for ptr in grads + batches:
        acl.rt.free(ptr)
    acl.rt.free_host(host_batch)


def main() -> None:
    rt = acl.init(seed=0, topology=topology.server(RANKS))
    rt.run_ranks(train)
    acl.finalize()


if __name__ == "__main__":
    main()
