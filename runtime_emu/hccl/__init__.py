"""HCCL collectives on the emulated runtime: pyACL-shaped calls whose cost follows HCCL's model.

    from runtime_emu import acl, hccl, topology
    rt = acl.init(topology=topology.server(8))

    def program(rank):
        acl.rt.set_device(rank % 8)
        comm = hccl.comm_init_all()                  # or get_root_info + comm_init_root_info
        stream = acl.rt.create_stream()
        hccl.all_reduce(src, dst, count, hccl.HCCL_DATA_TYPE_FP32, hccl.HCCL_REDUCE_SUM, comm, stream)
        acl.rt.synchronize_stream(stream)

    rt.run_ranks(program)

Modules: `algorithms` (pure step schedules and the automatic choice), `collective`
(communicators, matching, execution on the links, trace rows, ground truth), `api` (the calls).
"""

from runtime_emu.hccl import api as _api
from runtime_emu.hccl.algorithms import ALGORITHMS, AUTO, HD, HIERARCHICAL, MESH, PAIRWISE, RING
from runtime_emu.hccl.api import *  # noqa: F403 (the pyACL-shaped calls and HCCL_* constants)
from runtime_emu.hccl.collective import COMM_INIT_NS, DEFAULT_BUFFSIZE_MB, DEFAULT_REDUCE_GBPS, Comm, HcclState

__all__ = [*_api.__all__, "ALGORITHMS", "AUTO", "COMM_INIT_NS", "Comm", "DEFAULT_BUFFSIZE_MB", "DEFAULT_REDUCE_GBPS",
           "HD", "HIERARCHICAL", "HcclState", "MESH", "PAIRWISE", "RING"]
