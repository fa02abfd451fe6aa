"""A decode loop whose small kernels queue behind a background job's large kernels.

An inference server decodes one token per step: five small kernels on its own stream, then it
synchronizes that stream to read the token and pick the next input. Meanwhile a background job
(re-quantizing a cache) runs large MatMuls on another stream, each launching twice as many blocks
as the device has AI Cores. Both streams use the Cube cores; a started kernel keeps them until
its blocks are done, so every decode kernel that arrives while a MatMul runs waits for it,
although the decode stream was created with the highest priority. core_priority_twin.py is the
same program with priority preemption on (a waiting higher-priority kernel takes cores at the
next block boundary): the fix.
"""

import sys

from runtime_emu import Kernel, acl

STEPS = 60
BACKGROUND = 50

matmul = Kernel("BatchMatMul", block_ns=60_000, core="cube")
decode = [Kernel(f"Decode{i}", block_ns=15_000, core="cube") for i in range(5)]


def main(preemption: bool = False) -> None:
    acl.init(seed=0, preemption=preemption)
    acl.rt.set_device(0)
    background = acl.rt.create_stream(7)
    serving = acl.rt.create_stream(0)
    for _ in range(BACKGROUND):
        acl.rt.launch_kernel(matmul, 40, background)
    for _ in range(STEPS):
        with acl.prof.step():
            for k in decode:
                acl.rt.launch_kernel(k, 20, serving)
            acl.rt.synchronize_stream(serving)
            acl.prof.host_work("sample_next_token", 30_000)
    acl.rt.synchronize_stream(background)
    acl.finalize()


if __name__ == "__main__":
    main(preemption="--preemption" in sys.argv)
