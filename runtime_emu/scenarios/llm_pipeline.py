"""Pipeline-parallel pre-training of the llm-train decoder (hidden 2048, SwiGLU MLP 5632, bf16) on
one server: the model's layers split into one stage per NPU (4 by default, HCCS between them),
each step's batch (16 sequences of 2048 tokens) cut into micro-batches (16 by default) that
flow through the stages in a GPipe schedule (every micro-batch's forward, stage after stage,
then every micro-batch's backward in reverse) or, with `schedule=1f1b`, Megatron-LM's
one-forward-one-backward (each stage runs P - 1 - stage forwards, then a forward and a backward
in turn). Stage 0 loads the batch and runs the embedding
(GatherV2), the last stage the head and the loss; the `layers` decoder layers and the head are
spread so that every stage computes about as long. A stage receives its input (activations
forward, gradients backward) with HcclRecv on its compute stream, so the stream waits for the
peer; it sends its output with HcclSend on a send stream per direction, after an event, so the
compute goes on. After the last backward each stage updates its own parameters (ApplyAdamW) and
the host reads the step's end (the loss on the last stage). A pipeline of P stages and M micro-batches idles (P - 1) / (M + P - 1) of each step while it
fills and drains (the pipeline bubble): 16% here. Switch: too few micro-batches (pipeline-bubble:
the batch in as many micro-batches as there are stages, 43% of each step idle; the fix is more
micro-batches, as Megatron-LM advises M >= 4 P).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime_emu import hccl, topology
from runtime_emu.runtime import MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE
from runtime_emu.scenarios.llm_train_2server import HIDDEN, LAYER_PARAMS, MODEL, SEQ, VOCAB
from runtime_emu.scenarios.problems import _device_times, cost_dict, device_span_ns, kernel_idle_ns
from runtime_emu.scenarios.scenario import Config, Param, Scenario, TaskIndex, jittered, launch_op, where
from runtime_emu.scenarios.training import (
    DATALOADER_JITTER,
    DATALOADER_NS,
    KERNEL_JITTER,
    LOSS_BYTES,
    OPT_BYTES_PER_PARAM,
    hccl_runtime,
)

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

STAGES = 4  # NPUs, one stage each, by default
#: The head and loss cost about one decoder layer's time (a 32000-word vocabulary against a
#: 2048-wide layer), so they count as one layer when the stages are balanced.
HEAD_LAYERS = 1


def micro_batches(cfg: Config) -> int:
    """The micro-batches per step: the stage count with pipeline-bubble, else `micro_batches`."""
    return cfg.ranks if cfg.on("pipeline-bubble") else cfg["micro_batches"]


def stage_layers(layers: int, stages: int) -> list[int]:
    """Decoder layers per stage: `layers` + the head's HEAD_LAYERS spread evenly, the head last."""
    units = layers + HEAD_LAYERS
    per = [units // stages + (1 if s < units % stages else 0) for s in range(stages)]
    per[-1] -= HEAD_LAYERS
    return per


def units(schedule: str, stages: int, stage: int, m: int) -> list[tuple[str, int]]:
    """The micro-batch units ("F" / "B", micro-batch) a stage runs in a step, in order: GPipe runs
    every forward, then every backward; 1F1B runs P - 1 - stage forwards (the warm-up), then a
    forward and a backward in turn, then the backwards left."""
    if schedule == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    warm = min(stages - stage - 1, m)
    out = [("F", j) for j in range(warm)]
    for j in range(m - warm):
        out += [("F", warm + j), ("B", j)]
    return out + [("B", j) for j in range(m - warm, m)]


def program(rt: "Runtime", cfg: Config) -> None:
    with hccl_runtime(rt):
        rt.run_ranks(lambda rank: _Stage(rt, cfg, rank).train())


class _Stage:
    """One pipeline stage: its layers, streams, buffers; `train()` is its rank's program."""

    def __init__(self, rt: "Runtime", cfg: Config, rank: int) -> None:
        self.rt, self.cfg, self.rank = rt, cfg, rank
        self.stages = cfg.ranks
        self.first, self.last = rank == 0, rank == cfg.ranks - 1
        self.m = micro_batches(cfg)
        self.mb = cfg["batch"] // self.m  # sequences per micro-batch
        self.layers = stage_layers(cfg["layers"], self.stages)[rank]
        self.layer0 = sum(stage_layers(cfg["layers"], self.stages)[:rank])  # its first layer's index in the model

    def ops(self, phase: str) -> list[tuple[str, str, str, float]]:
        """(instance name, op type, core, ns) of one micro-batch's forward or backward on this stage."""
        m, mb = MODEL, self.mb
        seq: list[tuple[tuple, float]] = []
        if phase == "fwd":
            if self.first:
                seq.append((m.embed_fwd, m.embed_fwd_ns * mb))
            seq += [(m.layer_fwd, m.layer_fwd_ns * mb)] * self.layers
            if self.last:
                seq.append((m.head_fwd, m.head_fwd_ns * mb))
        else:
            if self.last:
                seq.append((m.head_bwd, 2 * m.head_fwd_ns * mb))
            seq += [(m.layer_bwd, 2 * m.layer_fwd_ns * mb)] * self.layers
            if self.first:
                seq.append((m.embed_bwd, 2 * m.embed_fwd_ns * mb))
        out, index = [], 0
        for ops, total in seq:
            scale = total / sum(share for _, _, share in ops)
            for op, core, share in ops:
                out.append((f"{op}{index}", op, core, share * scale))
                index += 1
        return out

    def train(self) -> None:
        rt, cfg = self.rt, self.cfg
        assert rt.topology is not None
        rt.set_device(rt.topology.local_of(self.rank))
        self.comm = hccl.comm_init_all()
        # Sends leave on a stream per direction (as Megatron-LM's isend), so the compute goes on.
        self.comp, self.send_f, self.send_b = rt.create_stream(), rt.create_stream(), rt.create_stream()
        act = self.mb * SEQ * HIDDEN * 2  # one micro-batch's bf16 activations (and their gradients)
        self.count = act // 2
        self.out = [self.rt.malloc(act) for _ in range(self.m)]  # what this stage sends, per micro-batch
        self.inp = self.rt.malloc(act)
        self.ev = [rt.create_event() for _ in range(2 * self.m)]
        self.done = [rt.create_event(), rt.create_event()]
        params = self.layers * LAYER_PARAMS + (VOCAB * HIDDEN if self.first else 0) \
            + (VOCAB * HIDDEN + HIDDEN if self.last else 0)
        self.opt_ns = params * OPT_BYTES_PER_PARAM / rt.preset.hbm_gbps
        batch_bytes = cfg["batch"] * MODEL.batch_bytes_per_sample
        self.host_batch, self.dev_batch = rt.malloc_host(batch_bytes), rt.malloc(batch_bytes)
        self.host_loss, self.dev_loss = rt.malloc_host(LOSS_BYTES), rt.malloc(LOSS_BYTES)
        self.recvs: list[int] = []
        for _ in range(cfg.steps):
            with rt.step():
                self.step(batch_bytes)
        rt.synchronize_device()
        if cfg.on("pipeline-bubble"):
            self.report()
        for ptr in (*self.out, self.inp, self.dev_batch, self.dev_loss):
            rt.free(ptr)
        for ptr in (self.host_batch, self.host_loss):
            rt.free_host(ptr)

    def step(self, batch_bytes: int) -> None:
        rt, comp = self.rt, self.comp
        if self.first:  # stage 0 feeds the pipeline (the last stage's labels ride along, as Megatron sends them)
            rt.host_work("DataLoader.__next__", jittered(rt, DATALOADER_NS, DATALOADER_JITTER), kind="data_load")
            rt.memcpy_async(self.dev_batch, batch_bytes, self.host_batch, batch_bytes, MEMCPY_HOST_TO_DEVICE, comp)
        fwd, bwd = self.ops("fwd"), self.ops("bwd")
        before, after = self.rank - 1 if not self.first else None, None if self.last else self.rank + 1
        for phase, j in units(self.cfg["schedule"], self.stages, self.rank, self.m):
            if phase == "F":  # forward: activations from the stage before, to the stage after
                self.exchange(j, fwd, upstream=before, downstream=after, send_s=self.send_f)
            else:  # backward: gradients from the stage after, to the stage before
                self.exchange(self.m + j, bwd, upstream=after, downstream=before, send_s=self.send_b)
        if self.last:
            rt.memcpy_async(self.host_loss, LOSS_BYTES, self.dev_loss, LOSS_BYTES, MEMCPY_DEVICE_TO_HOST, comp)
        for k, s in enumerate((self.send_f, self.send_b)):  # the last sends have left before the update
            rt.record_event(self.done[k], s)
            rt.stream_wait_event(comp, self.done[k])
        launch_op(rt, comp, "ApplyAdamW0", self.opt_ns, "vector", jitter=KERNEL_JITTER, op_type="ApplyAdamW")
        rt.synchronize_stream(comp)  # the step's end: loss.item() on the last stage, the update everywhere

    def exchange(self, k: int, ops: list[tuple[str, str, str, float]], upstream: int | None,
                 downstream: int | None, send_s: Any) -> None:
        """One micro-batch through this stage: receive from `upstream`, compute, send downstream."""
        rt, comp = self.rt, self.comp
        if upstream is not None:
            corr = hccl.recv(self.inp, self.count, hccl.HCCL_DATA_TYPE_BFP16, upstream, self.comm, comp)
            self.recvs.append(corr)
        for name, op_type, core, ns in ops:
            launch_op(rt, comp, name, ns, core, jitter=KERNEL_JITTER, op_type=op_type)
        if downstream is not None:
            ev = self.ev[k]
            rt.record_event(ev, comp)
            rt.stream_wait_event(send_s, ev)
            hccl.send(self.out[k % self.m], self.count, hccl.HCCL_DATA_TYPE_BFP16, downstream, self.comm, send_s)

    def report(self) -> None:
        """The pipeline-bubble problem on this stage: the compute stream's idle over the steps."""
        rank, comp, recvs, m = self.rank, self.comp, list(self.recvs), self.m

        def resolve(tasks: TaskIndex) -> dict[str, Any]:
            first, last = tasks[recvs[0]], tasks[recvs[-1]]
            dev = comp.device.id
            starts, ends, _ = _device_times(tasks, rank, dev)
            # The device's idle between its first and last kernel: the fill and drain (and the
            # transfers the compute waited for), which more micro-batches shrink.
            idle = kernel_idle_ns(tasks, rank, dev, starts[0], ends[-1])
            return {"when": {"start_ns": first.start_ns, "end_ns": last.end_ns},
                    "expected": {"micro_batches": m, "stages": self.stages,
                                 "bubble_share": round((self.stages - 1) / (m + self.stages - 1), 4),
                                 "cost": cost_dict(ns=idle, span_ns=device_span_ns(tasks, rank, dev))}}

        self.cfg.problems.add("pipeline-bubble", where=where(comp, call_site="pipeline.recv"), resolve=resolve,
                              detail=f"stage {rank} of {self.stages} runs the batch in {m} micro-batches: it idles "
                                     "while the pipeline fills and drains")


def runtime_options(cfg: Config) -> dict[str, Any]:
    return {"topology": topology.server(cfg.ranks)}


def check(cfg: Config) -> None:
    for name in ("batch", "layers", "micro_batches"):
        if cfg[name] < 1:
            raise ValueError(f"{name} must be >= 1, got {cfg[name]}")
    if cfg.ranks < 2 or cfg.ranks > 8:
        raise ValueError(f"ranks (pipeline stages on one server) must be 2..8, got {cfg.ranks}")
    m = micro_batches(cfg)
    if cfg["batch"] % m:
        raise ValueError(f"batch ({cfg['batch']}) must be a multiple of the micro-batches ({m})")
    if cfg["layers"] + HEAD_LAYERS < cfg.ranks:
        raise ValueError(f"layers must be at least {cfg.ranks - HEAD_LAYERS} for {cfg.ranks} stages, "
                         f"got {cfg['layers']}")


SCENARIO = Scenario(
    name="llm-pipeline", description=__doc__, program=program, switches=frozenset({"pipeline-bubble"}),
    default_steps=2, ranks=STAGES, multi_rank=True, check=check, runtime_options=runtime_options,
    size=lambda cfg: cfg.steps * micro_batches(cfg) * (60 * cfg["layers"] + 40),  # events per step, estimated
    params={
        "batch": Param(int, 16, "sequences of 2048 tokens per step (the global batch)", minimum=1),
        "micro_batches": Param(int, 16, "micro-batches per step (pipeline-bubble: as many as stages)", minimum=1),
        "layers": Param(int, 7, "decoder layers, spread over the stages with the head", minimum=1),
        "schedule": Param(str, "gpipe", "the pipeline schedule: every forward then every backward (gpipe), or "
                                        "one forward one backward (1f1b)", choices=("gpipe", "1f1b"))})
