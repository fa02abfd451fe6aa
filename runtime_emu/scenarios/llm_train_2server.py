"""Pre-training of a TinyLlama-1.1B-shaped LLM (hidden 2048, SwiGLU MLP 5632, 32 query and 4
key/value heads, vocabulary 32000, bf16) with ZeRO-style data parallelism on 16 NPUs in two
servers of 8 (HCCS inside a server, RoCE between them; `servers=N` runs N servers, of 8 NPUs
unless `ranks` says otherwise; 4 of its 22 layers and micro-batch 2 x 2048 tokens by default to
keep runs short; also called `llm-train`). Every rank runs the embedding (GatherV2), the decoder
layers (RmsNorm, MatMulV2 on the Cube cores for the QKV, output and MLP projections,
RotaryMul, FlashAttentionScore, SwiGlu, Add) and the untied LM head with its loss (LogSoftmaxV2,
NLLLoss), then the backward (MatMulV2, SwiGluGrad, RmsNormGrad, FlashAttentionScoreGrad,
RotaryMulGrad, EmbeddingDenseGrad). Each layer's bf16 gradients (and the head's, the
embedding's) form a bucket that a communication stream ReduceScatters over HCCL while the
backward goes on, ordered by events; HCCL picks the hierarchical algorithm for two servers
(intra-server mesh over HCCS, inter-server halving-doubling over RoCE between the NPUs in the
same position, so each NPU sends only a sixteenth of a bucket through its NIC). The ApplyAdamW
step updates each rank's shard, then the parameters are AllGathered bucket by bucket under the
next step's forward (each layer waits for its own gather); with `zero=False` the buckets are
AllReduced instead. Switches: one rank's NPU 40% slower, so the other 15 wait in Notify_Wait
before every collective (slow-rank); the RoCE NIC of the first rank of server 1 at a quarter of
its bandwidth, which slows the inter-server phase of every collective (slow-link); H2D prefetch
copies of offloaded optimizer state while the NICs hang off the cards' PCIe links, so the
inter-server phase and the copies share PCIe (bandwidth-contention, which turns
`roce_over_pcie` on; its healthy twin is `roce_over_pcie=True`); the last layer's output kept
every step on one rank (leak).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runtime_emu import hccl, topology
from runtime_emu.presets import MiB
from runtime_emu.scenarios import training
from runtime_emu.scenarios.cluster_problems import DATA_PARALLEL_SWITCHES, degrade
from runtime_emu.scenarios.scenario import Config, Param, Scenario
from runtime_emu.scenarios.training import Model, run_job

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

HIDDEN, MLP, VOCAB, SEQ, KV_DIM = 2048, 5632, 32000, 2048, 4 * 64
SERVERS = 2  # by default; `servers` takes another count
NPUS_PER_SERVER = 8  # the default world size is this many per server
LAYER_PARAMS = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_DIM + 3 * HIDDEN * MLP + 2 * HIDDEN

MODEL = Model(
    prefix="llama",
    embed_fwd=(("GatherV2", "vector", 1.0),),
    layer_fwd=(("RmsNorm", "vector", 0.3), ("MatMulV2", "cube", 3.0),  # Q, K and V in one
               ("RotaryMul", "vector", 0.3), ("FlashAttentionScore", "cube", 3.0), ("MatMulV2", "cube", 2.4),
               ("Add", "vector", 0.1), ("RmsNorm", "vector", 0.3),
               ("MatMulV2", "cube", 13.0),  # gate and up in one
               ("SwiGlu", "vector", 0.5), ("MatMulV2", "cube", 6.5), ("Add", "vector", 0.1)),
    head_fwd=(("RmsNorm", "vector", 0.3), ("MatMulV2", "cube", 10.0), ("LogSoftmaxV2", "vector", 1.0),
              ("NLLLoss", "vector", 0.2)),
    head_bwd=(("NLLLossGrad", "vector", 0.2), ("LogSoftmaxGrad", "vector", 1.0), ("MatMulV2", "cube", 10.0),
              ("MatMulV2", "cube", 10.0), ("RmsNormGrad", "vector", 0.6)),
    layer_bwd=(("MatMulV2", "cube", 6.5), ("MatMulV2", "cube", 6.5), ("SwiGluGrad", "vector", 0.8),
               ("MatMulV2", "cube", 13.0), ("MatMulV2", "cube", 13.0), ("RmsNormGrad", "vector", 0.6),
               ("Add", "vector", 0.1), ("MatMulV2", "cube", 2.4), ("MatMulV2", "cube", 2.4),
               ("FlashAttentionScoreGrad", "cube", 7.0), ("RotaryMulGrad", "vector", 0.5),
               ("MatMulV2", "cube", 3.0), ("MatMulV2", "cube", 3.0), ("RmsNormGrad", "vector", 0.6),
               ("Add", "vector", 0.1)),
    embed_bwd=(("EmbeddingDenseGrad", "vector", 1.0),),
    # DEFAULTS: ~200 GFLOP per layer and 2048-token sequence (causal attention) and ~270 GFLOP
    # for the head, at ~150 TFLOPS sustained bf16.
    layer_fwd_ns=1_310_000, embed_fwd_ns=20_000, head_fwd_ns=1_800_000,
    layer_params=LAYER_PARAMS, embed_params=VOCAB * HIDDEN, head_params=VOCAB * HIDDEN + HIDDEN, param_bytes=2,
    grad_dtype=hccl.HCCL_DATA_TYPE_BFP16,
    batch_bytes_per_sample=2 * SEQ * 8,  # token ids and labels (int64)
    leak_bytes_per_sample=SEQ * HIDDEN * 2,  # the last layer's bf16 output
    # DEFAULT: enough to run through the backward, so every collective's inter-server phase meets a copy.
    prefetch_bytes=512 * MiB,
    # DEFAULT: a 4 MiB copy (~0.17 ms on PCIe) fits inside one inter-server phase (~0.3 ms), so
    # the copies that meet it run at about half of PCIe rather than averaging the loss away.
    prefetch_chunk_bytes=4 * MiB,
)


def roce_over_pcie(cfg: Config) -> bool:
    """Whether the NICs hang off the cards' PCIe links: bandwidth-contention needs it."""
    chosen = cfg["roce_over_pcie"]
    return cfg.on("bandwidth-contention") if chosen is None else chosen


def program(rt: "Runtime", cfg: Config) -> None:
    run_job(rt, cfg, MODEL, zero=cfg["zero"])


def runtime_options(cfg: Config) -> dict[str, Any]:
    servers = cfg["servers"]
    topo = topology.cluster(servers, cfg.ranks // servers, roce_over_pcie=roce_over_pcie(cfg))
    return {"topology": degrade(topo, cfg)}


def check(cfg: Config) -> None:
    servers = cfg["servers"]
    if cfg.ranks < 2 * servers or cfg.ranks % servers:
        raise ValueError(f"ranks must be a multiple of {servers} servers with at least 2 NPUs each, got {cfg.ranks}")
    if cfg.on("bandwidth-contention") and cfg["roce_over_pcie"] is False:
        raise ValueError("bandwidth-contention needs roce_over_pcie=True: without it no collective crosses PCIe")
    training.check(cfg)


SCENARIO = Scenario(
    name="llm-train-2server", description=__doc__, program=program, switches=frozenset(DATA_PARALLEL_SWITCHES),
    default_steps=3, ranks=SERVERS * NPUS_PER_SERVER, ranks_for=lambda values: values["servers"] * NPUS_PER_SERVER,
    multi_rank=True, check=check, runtime_options=runtime_options,
    size=lambda cfg: cfg.ranks * cfg.steps * (300 + 240 * cfg["layers"]),  # trace events per rank-step, measured
    params={
        "servers": Param(int, SERVERS, f"servers joined by RoCE; --ranks defaults to {NPUS_PER_SERVER} NPUs per server",
                         minimum=2),
        "batch": Param(int, 2, "sequences of 2048 tokens per rank and step", minimum=1),
        "layers": Param(int, 4, "decoder layers (TinyLlama-1.1B has 22)", minimum=1),
        "zero": Param(bool, True, "ReduceScatter + AllGather (ZeRO); false: AllReduce"),
        "roce_over_pcie": Param(bool, None, "the NICs hang off the cards' PCIe links; auto: only with "
                                            "bandwidth-contention", optional=True),
        "problem_rank": Param(int, None, training.PROBLEM_RANK_HELP, minimum=0, auto=training.problem_rank)})
