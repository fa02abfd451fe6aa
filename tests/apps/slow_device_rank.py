"""Data-parallel training on 4 NPUs where one rank got a larger batch by a sharding bug.

Rank 1's shard is 50% larger, so its forward and backward kernels run 50% longer; the other
ranks reach each gradient allreduce first and wait there for rank 1.
"""

from runtime_emu import Kernel, acl, hccl, topology

MiB = 1 << 20
RANKS = 4
STEPS = 6
SLOW_RANK = 1
GRAD_BYTES = 8 * MiB


def train(rank: int) -> None:
    scale = 1.5 if rank == SLOW_RANK else 1.0
    forward = Kernel("Forward", block_ns=int(60_000 * scale), core="cube")
    backward = Kernel("Backward", block_ns=int(120_000 * scale), core="cube")
    optimizer = Kernel("AdamW", block_ns=20_000, core="vector")
    acl.rt.set_device(rank % RANKS)
    comm = hccl.comm_init_all()
    compute = acl.rt.create_stream()
    grads = acl.rt.malloc(GRAD_BYTES)
    for _ in range(STEPS):
        with acl.prof.step():
            for _ in range(4):
                acl.rt.launch_kernel(forward, 20, compute)
            for _ in range(4):
                acl.rt.launch_kernel(backward, 20, compute)
            hccl.all_reduce(grads, grads, GRAD_BYTES // 4, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm,
                            compute)
            acl.rt.launch_kernel(optimizer, 40, compute)
            acl.rt.synchronize_stream(compute)
    acl.rt.free(grads)


def main() -> None:
    rt = acl.init(seed=0, topology=topology.server(RANKS))
    rt.run_ranks(train)
    acl.finalize()


if __name__ == "__main__":
    main()
