"""BERT-base masked-language-model pre-training, data-parallel on one server of 8 NPUs (default
micro-batch 16 sequences of 512 tokens per rank, mixed precision with fp16 gradients; 4 of
BERT-base's 12 layers by default to keep runs short). Every rank loads its batch
(DataLoader), copies it in (H2D), runs the embeddings (GatherV2, LayerNorm), the encoder layers
(MatMulV2 and BatchMatMulV2 on the Cube cores; ConfusionTransposeD, SoftmaxV2, DropOutDoMask,
FastGelu, LayerNorm on the Vector cores) and the MLM head with its loss (LogSoftmaxV2, NLLLoss),
then the backward in reverse (the same ops' Grad kernels, EmbeddingDenseGrad). As PyTorch DDP
does, each layer's gradients form a bucket that is AllReduced over HCCL on a separate
communication stream, ordered after the layer's backward by an event, while the backward goes on;
the ApplyAdamW optimizer step waits for the last bucket, and the host reads the loss at the end
of each step (ProfilerStep). The server joins its NPUs by HCCS in a full mesh (HCCL chooses the
mesh algorithm) or, with `intra="pcie"` (a PCIe-card server), through the host's PCIe switch
(ring). Switches: one rank's NPU 40% slower, so the others wait in Notify_Wait before every
AllReduce (slow-rank); one HCCS link (on a PCIe server: one card's PCIe link) at a quarter of its
bandwidth (slow-link); H2D prefetch copies of offloaded optimizer state on the PCIe links the
AllReduce also crosses, which needs the PCIe server and turns it on (bandwidth-contention; its
healthy twin is `intra="pcie"`); the last layer's output kept every step on one rank (leak).
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

HIDDEN, FFN, VOCAB, SEQ = 768, 3072, 30522, 512
LAYER_PARAMS = 4 * HIDDEN * HIDDEN + 4 * HIDDEN + 2 * HIDDEN * FFN + FFN + HIDDEN + 4 * HIDDEN
# Word, position and token-type embeddings with their LayerNorm; the MLM head's transform,
# LayerNorm and decoder bias (its decoder weight is the word embedding).
EDGE_PARAMS = (VOCAB + SEQ + 2) * HIDDEN + 2 * HIDDEN + HIDDEN * HIDDEN + 3 * HIDDEN + VOCAB

MODEL = Model(
    prefix="bert",
    embed_fwd=(("GatherV2", "vector", 1.0), ("GatherV2", "vector", 0.3), ("GatherV2", "vector", 0.3),
               ("AddN", "vector", 0.4), ("LayerNorm", "vector", 0.6), ("DropOutDoMask", "vector", 0.4)),
    layer_fwd=(("MatMulV2", "cube", 3.0),  # Q, K and V projections in one
               ("ConfusionTransposeD", "vector", 0.2), ("BatchMatMulV2", "cube", 1.0), ("Muls", "vector", 0.1),
               ("Add", "vector", 0.1), ("SoftmaxV2", "vector", 0.3), ("DropOutDoMask", "vector", 0.15),
               ("BatchMatMulV2", "cube", 1.0), ("ConfusionTransposeD", "vector", 0.2), ("MatMulV2", "cube", 1.0),
               ("DropOutDoMask", "vector", 0.1), ("Add", "vector", 0.1), ("LayerNorm", "vector", 0.2),
               ("MatMulV2", "cube", 4.0), ("FastGelu", "vector", 0.4), ("MatMulV2", "cube", 4.0),
               ("DropOutDoMask", "vector", 0.1), ("Add", "vector", 0.1), ("LayerNorm", "vector", 0.2)),
    head_fwd=(("GatherV2", "vector", 0.2),  # the masked positions
              ("MatMulV2", "cube", 1.0), ("FastGelu", "vector", 0.2), ("LayerNorm", "vector", 0.2),
              ("MatMulV2", "cube", 6.0), ("Add", "vector", 0.3), ("LogSoftmaxV2", "vector", 1.0),
              ("NLLLoss", "vector", 0.3)),
    head_bwd=(("NLLLossGrad", "vector", 0.3), ("LogSoftmaxGrad", "vector", 1.0), ("MatMulV2", "cube", 6.0),
              ("MatMulV2", "cube", 6.0), ("ReduceSumD", "vector", 0.3), ("LayerNormGrad", "vector", 0.4),
              ("FastGeluGrad", "vector", 0.3), ("MatMulV2", "cube", 1.0), ("MatMulV2", "cube", 1.0),
              ("ScatterNdAdd", "vector", 0.3)),
    layer_bwd=(("LayerNormGrad", "vector", 0.4), ("DropOutDoMask", "vector", 0.1),
               ("MatMulV2", "cube", 4.0), ("MatMulV2", "cube", 4.0), ("ReduceSumD", "vector", 0.1),  # FFN down
               ("FastGeluGrad", "vector", 0.5),
               ("MatMulV2", "cube", 4.0), ("MatMulV2", "cube", 4.0), ("ReduceSumD", "vector", 0.1),  # FFN up
               ("AddN", "vector", 0.1), ("LayerNormGrad", "vector", 0.4), ("DropOutDoMask", "vector", 0.1),
               ("MatMulV2", "cube", 1.0), ("MatMulV2", "cube", 1.0), ("ReduceSumD", "vector", 0.1),  # output
               ("ConfusionTransposeD", "vector", 0.2), ("BatchMatMulV2", "cube", 1.0),
               ("BatchMatMulV2", "cube", 1.0), ("DropOutDoMask", "vector", 0.15), ("SoftmaxGrad", "vector", 0.4),
               ("Muls", "vector", 0.1), ("BatchMatMulV2", "cube", 1.0), ("BatchMatMulV2", "cube", 1.0),
               ("ConfusionTransposeD", "vector", 0.2),
               ("MatMulV2", "cube", 3.0), ("MatMulV2", "cube", 3.0), ("ReduceSumD", "vector", 0.1),  # Q, K, V
               ("AddN", "vector", 0.1)),
    embed_bwd=(("DropOutDoMask", "vector", 0.4), ("LayerNormGrad", "vector", 0.8),
               ("EmbeddingDenseGrad", "vector", 3.0), ("EmbeddingDenseGrad", "vector", 0.4),
               ("EmbeddingDenseGrad", "vector", 0.4)),
    # DEFAULTS: ~130 GFLOP per layer for 16 x 512 tokens at ~150 TFLOPS sustained fp16; the MLM
    # head predicts only the masked 15% of positions.
    layer_fwd_ns=54_000, embed_fwd_ns=4_000, head_fwd_ns=25_000,
    layer_params=LAYER_PARAMS, embed_params=EDGE_PARAMS, head_params=0, param_bytes=2, grad_dtype=hccl.HCCL_DATA_TYPE_FP16,
    batch_bytes_per_sample=4 * SEQ * 8,  # input ids, token types, attention mask, MLM labels (int64)
    leak_bytes_per_sample=SEQ * HIDDEN * 2,  # the last layer's fp16 output
    prefetch_bytes=128 * MiB,  # DEFAULT
)


def intra(cfg: Config) -> str:
    """The server's interconnect: bandwidth-contention needs the collectives on PCIe."""
    return cfg["intra"] or ("pcie" if cfg.on("bandwidth-contention") else "hccs")


def program(rt: "Runtime", cfg: Config) -> None:
    run_job(rt, cfg, MODEL, zero=False)


def runtime_options(cfg: Config) -> dict[str, Any]:
    return {"topology": degrade(topology.server(cfg.ranks, intra=intra(cfg)), cfg)}


def check(cfg: Config) -> None:
    if cfg.ranks < 2:
        raise ValueError(f"data-parallel training needs at least 2 ranks, got {cfg.ranks}")
    if cfg.on("bandwidth-contention") and cfg["intra"] == "hccs":
        raise ValueError("bandwidth-contention needs intra='pcie': over HCCS the AllReduce does not cross PCIe")
    training.check(cfg)


SCENARIO = Scenario(
    name="bert-train-dp", description=__doc__, program=program, switches=frozenset(DATA_PARALLEL_SWITCHES),
    default_steps=3, ranks=8, multi_rank=True, check=check, runtime_options=runtime_options,
    size=lambda cfg: cfg.ranks * cfg.steps * (300 + 340 * cfg["layers"]),  # trace events per rank-step, measured
    params={
        "batch": Param(int, 16, "sequences of 512 tokens per rank and step", minimum=1),
        "layers": Param(int, 4, "encoder layers (BERT-base has 12)", minimum=1),
        "intra": Param(str, None, "the server's interconnect: hccs (full mesh) or pcie (through the host's PCIe "
                                  "switch); auto: hccs, pcie with bandwidth-contention",
                       choices=("hccs", "pcie"), optional=True),
        "problem_rank": Param(int, None, training.PROBLEM_RANK_HELP, minimum=0, auto=training.problem_rank)})
