"""Attention over a small batch: each head's kernel is tiled into 4 blocks on a device with 20 AI
Cores, so 16 cores idle while it runs. wide_kernels.py is the same work tiled into 20 blocks
(one per core, each a fifth as long): the fix."""

import sys

from runtime_emu import Kernel, acl

STEPS = 8
HEADS = 12


def main(blocks: int = 4) -> None:
    # The same work per head whatever the tiling: 4 blocks of 100 us = 20 blocks of 20 us.
    attention = Kernel("FlashAttentionScore", block_ns=400_000 // blocks, core="cube")
    norm = Kernel("LayerNorm", block_ns=10_000, core="vector")
    acl.init(seed=0)
    acl.rt.set_device(0)
    stream = acl.rt.create_stream()
    for _ in range(STEPS):
        with acl.prof.step():
            for _ in range(HEADS):
                acl.rt.launch_kernel(attention, blocks, stream)
            acl.rt.launch_kernel(norm, 40, stream)
            acl.rt.synchronize_stream(stream)
    acl.finalize()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
