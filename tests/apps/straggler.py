"""Data-parallel training on 4 NPUs where one rank's data loading is slow.

Every rank decodes its own batch on the host, copies it in, runs forward and backward, and
all-reduces the gradients before the optimizer step. Rank 2 reads its shard from a slow disk:
its host-side loading takes 2 ms longer every step, so the other ranks reach each allreduce
first and wait there for rank 2.
"""

from runtime_emu import Kernel, acl, hccl, topology

MiB = 1 << 20
RANKS = 4
STEPS = 6
SLOW_RANK = 2
BATCH_BYTES = 4 * MiB
GRAD_BYTES = 16 * MiB

forward = Kernel("Forward", block_ns=60_000, core="cube")
backward = Kernel("Backward", block_ns=120_000, core="cube")
optimizer = Kernel("AdamW", block_ns=20_000, core="vector")


def train(rank: int) -> None:
    acl.rt.set_device(rank % RANKS)
    comm = hccl.comm_init_all()
    compute = acl.rt.create_stream()
    host_batch = acl.rt.malloc_host(BATCH_BYTES)
    batch = acl.rt.malloc(BATCH_BYTES)
    grads = acl.rt.malloc(GRAD_BYTES)
    for _ in range(STEPS):
        with acl.prof.step():
            acl.prof.host_work("load_batch", 300_000 + (2_000_000 if rank == SLOW_RANK else 0))
            acl.rt.memcpy_async(batch, BATCH_BYTES, host_batch, BATCH_BYTES, acl.ACL_MEMCPY_HOST_TO_DEVICE, compute)
            for _ in range(4):
                acl.rt.launch_kernel(forward, 20, compute)
            for _ in range(4):
                acl.rt.launch_kernel(backward, 20, compute)
            hccl.all_reduce(grads, grads, GRAD_BYTES // 4, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm,
                            compute)
            acl.rt.launch_kernel(optimizer, 40, compute)
            acl.rt.synchronize_stream(compute)
    acl.rt.free(batch)
    acl.rt.free(grads)
    acl.rt.free_host(host_batch)


def main() -> None:
    rt = acl.init(seed=0, topology=topology.server(RANKS))
    rt.run_ranks(train)
    acl.finalize()


if __name__ == "__main__":
    main()
