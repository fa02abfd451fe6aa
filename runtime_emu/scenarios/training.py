"""Data-parallel training on every rank of a job: the step loop the training scenarios share.

Each rank runs the same program on its own host thread (`rt.run_ranks`), as one process per NPU
does. A compute stream runs the forward, the loss and the backward layer by layer; after each
layer's backward an event hands its gradient bucket to a communication stream, which reduces it
across the ranks (HCCL AllReduce, or ReduceScatter with ZeRO) while the backward goes on; the
optimizer step waits for the last bucket. With ZeRO each rank then updates only its shard and
AllGathers the parameters bucket by bucket; the next step's forward waits for each layer's
gather, so the gathers run under it. The host ends a step reading the loss (D2H + synchronize),
as a training script that logs it does.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from runtime_emu import acl, hccl
from runtime_emu.runtime import MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE
from runtime_emu.scenarios.cluster_problems import PREFETCH_CHUNK_BYTES, ClusterProblems
from runtime_emu.scenarios.scenario import Config, jittered, launch_op

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

#: (op type, core, share of its phase's device time); shares are DEFAULTS, not measurements.
Op = tuple[str, str, float]

DATALOADER_NS = 150_000  # DEFAULT: the main process fetching a prepared batch from the workers
DATALOADER_JITTER = 0.05
# DEFAULT: kernels of fixed shapes on identical NPUs take almost the same time on every rank and
# step; with the 3% of the inference scenarios the ranks would drift apart by more than a
# healthy job does.
KERNEL_JITTER = 0.005
OPT_BYTES_PER_PARAM = 28  # AdamW reads and writes fp32 param, m, v and reads the grad (HBM bound)
LOSS_BYTES = 4


@dataclass(frozen=True)
class Model:
    """A transformer as the trainer launches it: op lists per phase, times and sizes per layer."""

    prefix: str  # call sites and host slices start with it ("bert", "llama")
    embed_fwd: tuple[Op, ...]
    layer_fwd: tuple[Op, ...]
    head_fwd: tuple[Op, ...]  # up to and including the loss
    head_bwd: tuple[Op, ...]
    layer_bwd: tuple[Op, ...]
    embed_bwd: tuple[Op, ...]
    #: Device time per sample of the batch: one layer's forward, the embedding's, the head's.
    #: A backward phase takes twice its forward.
    layer_fwd_ns: float
    embed_fwd_ns: float
    head_fwd_ns: float
    layer_params: int
    embed_params: int  # with a head tied to the embeddings, the head's parameters too
    head_params: int  # an untied head's parameters (0: tied); its bucket is reduced first
    param_bytes: int  # per parameter, as trained (fp16 / bf16)
    grad_dtype: int  # HcclDataType of the gradients
    batch_bytes_per_sample: int  # the H2D of one sample's inputs
    leak_bytes_per_sample: int  # what the leak keeps each step (one layer's output)
    #: What the bandwidth-contention switch swaps in per step and rank (offloaded optimizer state).
    prefetch_bytes: int
    #: The size of each of those copies: copies much shorter than a collective's PCIe phase run
    #: wholly inside it, so the contention shows in their bandwidth and not only in an average.
    prefetch_chunk_bytes: int = PREFETCH_CHUNK_BYTES


@contextlib.contextmanager
def hccl_runtime(rt: "Runtime") -> Iterator[None]:
    """Make `rt` the runtime the pyACL-shaped hccl calls act on, for the job's lifetime."""
    saved, acl._current = acl._current, rt
    try:
        yield
    finally:
        acl._current = saved


def run_job(rt: "Runtime", cfg: Config, model: Model, zero: bool) -> None:
    """Train `model` data-parallel on every rank of rt's topology for cfg.steps steps."""
    problems = ClusterProblems(rt, cfg, f"{model.prefix}.train_step", model.prefetch_bytes,
                               model.prefetch_chunk_bytes)
    with hccl_runtime(rt):
        rt.run_ranks(lambda rank: _Rank(rt, cfg, model, zero, problems, rank).train())


#: The rank slow-rank and leak act on unless `problem_rank` says: the fourth rank (of server 1
#: when there are several servers, so that it is not on rank 0's server nor the slow NIC's rank).
PROBLEM_RANK_HELP = "the rank slow-rank and leak act on; auto: rank 3 of the job (of server 1 with several servers)"


def problem_rank(ranks: int, values: Mapping[str, Any]) -> int:
    """The default `problem_rank` for a world of `ranks` (3 of 8, 11 of 2 x 8): always one of them."""
    servers = max(1, values.get("servers", 1))
    per = max(1, ranks // servers)
    return min((per if servers > 1 else 0) + min(3, per - 1), ranks - 1)


def check(cfg: Config) -> None:
    """The checks every training scenario makes (its own come on top)."""
    for name in ("batch", "layers"):
        if cfg[name] < 1:
            raise ValueError(f"{name} must be >= 1, got {cfg[name]}")
    if not 0 <= cfg["problem_rank"] < cfg.ranks:
        raise ValueError(f"problem_rank must be 0..{cfg.ranks - 1}, got {cfg['problem_rank']}")


def _phase(ops: tuple[Op, ...], total_ns: float) -> list[tuple[str, str, float]]:
    scale = total_ns / sum(share for _, _, share in ops)
    return [(op, core, share * scale) for op, core, share in ops]


class _Rank:
    """One rank's streams, buffers and events; `train()` is its program."""

    def __init__(self, rt: "Runtime", cfg: Config, model: Model, zero: bool, problems: ClusterProblems,
                 rank: int) -> None:
        self.rt, self.cfg, self.model, self.zero, self.problems = rt, cfg, model, zero, problems
        self.rank = rank
        self.inj = problems.injector(rank)
        self.factor = problems.compute_factor(rank)
        batch, layers = cfg["batch"], cfg["layers"]
        f, e, h = model.layer_fwd_ns * batch, model.embed_fwd_ns * batch, model.head_fwd_ns * batch
        # torch_npu-style kernel names: op type + index in the step's op sequence (the same on every rank).
        seq = [_phase(model.embed_fwd, e), *[_phase(model.layer_fwd, f)] * layers, _phase(model.head_fwd, h),
               _phase(model.head_bwd, 2 * h), *[_phase(model.layer_bwd, 2 * f)] * layers,
               _phase(model.embed_bwd, 2 * e)]
        index = 0
        self.phases: list[list[tuple[str, str, float]]] = []
        self.op_types: dict[str, str] = {}  # instance name -> msprof's OP Type
        for ops in seq:
            self.phases.append([(f"{op}{index + k}", core, ns) for k, (op, core, ns) in enumerate(ops)])
            self.op_types.update((f"{op}{index + k}", op) for k, (op, _, _) in enumerate(ops))
            index += len(ops)
        self.opt_index = index  # one ApplyAdamW per bucket follows the backward
        world = rt.world_size
        # Bucket 0 holds the embeddings, bucket l the l-th layer, bucket layers + 1 an untied head;
        # ZeRO pads each to a multiple of the world size.
        params = [model.embed_params] + [model.layer_params] * layers + ([model.head_params] if model.head_params
                                                                         else [])
        self.elems = [-(-p // world) * world for p in params]
        self.shard = [n // world for n in self.elems]

    def train(self) -> None:
        rt, cfg, model = self.rt, self.cfg, self.model
        rank = self.rank
        assert rt.topology is not None, "data-parallel training runs on a topology"
        rt.set_device(rt.topology.local_of(rank))
        self.comm = hccl.comm_init_all()
        self.comp, self.comm_s = rt.create_stream(), rt.create_stream()
        pb = model.param_bytes
        self.params = [rt.malloc(n * pb) for n in self.elems]
        self.grads = [rt.malloc(n * pb) for n in self.elems]
        self.grad_shards = [rt.malloc(n * pb) for n in self.shard]
        opt_elems = self.shard if self.zero else self.elems
        self.states = rt.malloc(sum(opt_elems) * 12)  # fp32 master weights, m and v
        batch_bytes = cfg["batch"] * model.batch_bytes_per_sample
        self.host_batch, self.dev_batch = rt.malloc_host(batch_bytes), rt.malloc(batch_bytes)
        self.host_loss, self.dev_loss = rt.malloc_host(LOSS_BYTES), rt.malloc(LOSS_BYTES)
        buckets = len(self.elems)
        self.ev_grad = [rt.create_event() for _ in range(buckets)]
        self.ev_param = [rt.create_event() for _ in range(buckets)]
        self.ev_reduced, self.ev_updated = rt.create_event(), rt.create_event()
        self.problems.start(self.comp, self.comm_s)
        for _ in range(cfg.steps):
            with rt.step():
                self.step(batch_bytes)
        rt.synchronize_device()
        self.problems.close(rank)
        for ptr in (*self.params, *self.grads, *self.grad_shards, self.states, self.dev_batch, self.dev_loss):
            rt.free(ptr)
        for ptr in (self.host_batch, self.host_loss):
            rt.free_host(ptr)

    def step(self, batch_bytes: int) -> None:
        rt, model, comp = self.rt, self.model, self.comp
        layers = self.cfg["layers"]
        head = layers + 1 if len(self.elems) > layers + 1 else None
        rt.host_work("DataLoader.__next__", jittered(rt, DATALOADER_NS, DATALOADER_JITTER), kind="data_load")
        rt.memcpy_async(self.dev_batch, batch_bytes, self.host_batch, batch_bytes, MEMCPY_HOST_TO_DEVICE, comp)
        phases = iter(self.phases)
        # Forward: with ZeRO each layer first waits for its parameters' gather (a no-op in step 0).
        self.wait_params(0)
        self.run(next(phases))
        for layer in range(1, layers + 1):
            self.wait_params(layer)
            self.run(next(phases))
        kept = self.inj.step_alloc(f"{model.prefix}.train_step:loss_history", self.cfg["batch"]
                                   * model.leak_bytes_per_sample, comp)
        if head is not None:
            self.wait_params(head)
        self.run(next(phases))  # head and loss
        rt.memcpy_async(self.host_loss, LOSS_BYTES, self.dev_loss, LOSS_BYTES, MEMCPY_DEVICE_TO_HOST, comp)
        # Backward: each bucket goes to the communication stream as soon as its gradients exist.
        self.run(next(phases))
        # Without overlap (the no-overlap switch) every bucket waits for the whole backward.
        buckets = ([head] if head is not None else []) + list(range(layers, 0, -1))
        defer = self.problems.on("no-overlap")
        for k, bucket in enumerate(buckets):
            if bucket != head:
                self.run(next(phases))
            if not defer:
                self.reduce(bucket)
                if k == 0:
                    self.problems.prefetch(self.ev_grad[bucket], comp)
        self.run(next(phases))
        if defer:
            corrs = []
            for k, bucket in enumerate(buckets):
                corrs.append(self.reduce(bucket))
                if k == 0:  # the prefetch still starts with the first bucket's reduce
                    self.problems.prefetch(self.ev_grad[bucket], comp)
            self.problems.deferred(self.rank, corrs)
        self.reduce(0)
        rt.record_event(self.ev_reduced, self.comm_s)
        rt.stream_wait_event(comp, self.ev_reduced)
        opt_elems = self.shard if self.zero else self.elems
        for b, n in enumerate(opt_elems):
            self.launch(f"ApplyAdamW{self.opt_index + b}", n * OPT_BYTES_PER_PARAM / rt.preset.hbm_gbps, "vector",
                        op_type="ApplyAdamW")
        if self.zero:
            rt.record_event(self.ev_updated, comp)
            rt.stream_wait_event(self.comm_s, self.ev_updated)
            for b, n in enumerate(self.shard):
                hccl.all_gather(self.params[b] + self.rank * n * model.param_bytes, self.params[b], n,
                                model.grad_dtype, self.comm, self.comm_s)
                rt.record_event(self.ev_param[b], self.comm_s)
        self.inj.step_free(kept)
        rt.synchronize_stream(comp)  # loss.item()

    def wait_params(self, bucket: int) -> None:
        if self.zero:
            self.rt.stream_wait_event(self.comp, self.ev_param[bucket])

    def reduce(self, bucket: int) -> int:
        """Hand `bucket`'s gradients to the communication stream and reduce them; the collective's corr."""
        rt, comm, dtype = self.rt, self.comm, self.model.grad_dtype
        rt.record_event(self.ev_grad[bucket], self.comp)
        rt.stream_wait_event(self.comm_s, self.ev_grad[bucket])
        grads = self.grads[bucket]
        if self.zero:
            return hccl.reduce_scatter(grads, self.grad_shards[bucket], self.shard[bucket], dtype,
                                       hccl.HCCL_REDUCE_SUM, comm, self.comm_s)
        return hccl.all_reduce(grads, grads, self.elems[bucket], dtype, hccl.HCCL_REDUCE_SUM, comm, self.comm_s)

    def run(self, ops: list[tuple[str, str, float]]) -> None:
        for name, core, ns in ops:
            self.launch(name, ns, core)

    def launch(self, name: str, ns: float, core: str, op_type: str = "") -> None:
        corr = launch_op(self.rt, self.comp, name, ns * self.factor, core, jitter=KERNEL_JITTER,
                         op_type=op_type or self.op_types[name])
        if self.factor != 1.0:
            self.problems.slowed(corr)
