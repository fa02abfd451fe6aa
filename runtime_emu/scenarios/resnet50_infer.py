"""ResNet-50 image classification, served in batches (default 16 images of 224x224, fp32 in, fp16 compute) on one NPU.
Each batch is copied in from pinned memory (H2D), converted to the NPU's 5HD layout (TransData), run
through the network op by op (Conv2D on the Cube cores; BNInfer, Relu, Add, MaxPoolV3, ReduceMeanD
and SoftmaxV2 on the Vector cores; MatMulV2 for the classifier), reduced to the top-5 classes
(TopKV2, on the I/O stream) and copied out (D2H). Healthy, it is double-buffered over two streams:
an I/O stream copies batch i+1 in while the compute stream runs batch i, with events marking input
ready (I/O -> compute) and logits ready (compute -> I/O), so the Cube cores never wait for a copy.
The switches break it the usual ways: the layer-4 features kept every step (leak), a burst of
interleaved activations (fragmentation), a per-sample post-processing loop (launch-bound), one
stream with a synchronize after each copy (serial-copies), the logits event recorded before the
classifier head so that TopKV2 reads the logits while MatMulV2 writes them (missing-sync), an
IsFinite check per tensor on a side stream (queue-congestion) and a prefetch sharing the input
copy's PCIe direction (bandwidth-contention).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime_emu.runtime import MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE
from runtime_emu.scenarios.problems import SWITCHES, Injector
from runtime_emu.scenarios.scenario import Config, Param, Scenario, jittered, launch_op

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

IMAGE_NS = 200_000  # DEFAULT: device time per image (~5000 images/s on a 910B-class NPU), not measured
TRANSDATA_NS_PER_IMAGE = 1_200  # DEFAULT: NCHW -> NC1HWC0 of one 3x224x224 image (HBM bound)
TOPK_NS_PER_IMAGE = 500  # DEFAULT
POSTPROCESS_NS = 30_000  # DEFAULT: host side: top-5 indices to labels
WEIGHT_BYTES = 25_557_032 * 2  # ResNet-50's parameters in fp16
IMAGE_BYTES = 3 * 224 * 224 * 4  # one input image as the host hands it over: NCHW fp32 (TransData casts)
IMAGE_5HD_BYTES = 16 * 224 * 224 * 2  # NC1HWC0 pads 3 channels to C0 = 16
FEATURES_BYTES = 2048 * 7 * 7 * 2  # layer-4 output per image, what the leak keeps
TOPK_BYTES = 5 * (2 + 4)  # top-5 values (fp16) and indices (int32) per image
LOGITS_BYTES = 1000 * 2  # per image, fp16
EVENTS_PER_STEP = 1_150  # trace events of a healthy step (measured; the op count does not depend on the batch)
HEAD_OPS = 3  # ReduceMeanD, MatMulV2 (writes the logits), SoftmaxV2 (reads them)
#: The per-sample post-processing loop of the launch-bound switch: (aten op, NPU op type).
PER_SAMPLE_OPS = [("aten::select", "StridedSliceD"), ("aten::softmax", "SoftmaxV2"), ("aten::topk", "TopKV2"),
                  ("aten::to", "Cast")]


def model_ops() -> list[tuple[str, str, float]]:
    """ResNet-50's forward pass as (op type, core, relative cost); BN and ReLU are not fused.

    The relative costs are DEFAULTS (rough shares of FLOPs and bytes moved), not measurements.
    """
    bn, relu = ("BNInfer", "vector", 0.25), ("Relu", "vector", 0.15)
    ops = [("Conv2D", "cube", 2.0), bn, relu, ("MaxPoolV3", "vector", 0.3)]
    for blocks in (3, 4, 6, 3):
        for j in range(blocks):
            ops += [("Conv2D", "cube", 1.0), bn, relu, ("Conv2D", "cube", 1.6), bn, relu, ("Conv2D", "cube", 1.0), bn]
            if j == 0:  # the projection shortcut
                ops += [("Conv2D", "cube", 1.0), bn]
            ops += [("Add", "vector", 0.2), relu]
    return ops + [("ReduceMeanD", "vector", 0.1), ("MatMulV2", "cube", 0.3), ("SoftmaxV2", "vector", 0.05)]


class _Server:
    """Streams, buffers and events of the serving loop; stage methods launch one batch's work."""

    def __init__(self, rt: "Runtime", cfg: Config) -> None:
        self.rt, self.cfg = rt, cfg
        self.inj = Injector(rt, cfg)
        self.batch = batch = cfg["batch"]
        self.serial = cfg.on("serial-copies")
        rt.set_device(0)
        self.io = rt.create_stream()
        self.comp = self.io if self.serial else rt.create_stream()
        ops = model_ops()
        scale = batch * IMAGE_NS / sum(cost for _, _, cost in ops)
        # torch_npu-style names (op type + graph index): TransData0, the model, then TopKV2.
        self.ops = [(f"{op}{i}", core, cost * scale) for i, (op, core, cost) in enumerate(ops, start=1)]
        self.op_types = {f"{op}{i}": op for i, (op, _, _) in enumerate(ops, start=1)}  # msprof's OP Type
        self.topk_name = f"TopKV2{len(ops) + 1}"
        self.in_bytes, self.top_bytes = batch * IMAGE_BYTES, batch * TOPK_BYTES
        self.weights = rt.malloc(WEIGHT_BYTES)
        self.host_in = [rt.malloc_host(self.in_bytes) for _ in range(2)]
        self.dev_in = [rt.malloc(self.in_bytes) for _ in range(2)]
        self.dev_5hd = [rt.malloc(batch * IMAGE_5HD_BYTES) for _ in range(2)]
        self.logits = [rt.malloc(batch * LOGITS_BYTES) for _ in range(2)]
        self.probs = [rt.malloc(batch * LOGITS_BYTES) for _ in range(2)]
        self.dev_top = [rt.malloc(self.top_bytes) for _ in range(2)]
        self.host_out = [rt.malloc_host(self.top_bytes) for _ in range(2)]
        self.ev_in, self.ev_out, self.ev_done = ([rt.create_event() for _ in range(2)] for _ in range(3))
        self.matmul: dict[int, int] = {}  # batch -> corr of the kernel writing its logits
        self.last_kernel: int | None = None  # on the single stream of serial-copies
        self.copies: list[int] = []  # copies since the last kernel (serial-copies)

    # ------------------------------------------------------------------ stages
    def input_stage(self, j: int) -> None:
        rt, b = self.rt, j % 2
        report = self.inj.contend(self.io, self.in_bytes)
        h2d = rt.memcpy_async(self.dev_in[b], self.in_bytes, self.host_in[b], self.in_bytes, MEMCPY_HOST_TO_DEVICE,
                              self.io)
        report(h2d)
        if self.serial:
            rt.synchronize_stream(self.io)
            self.copies.append(h2d)
        transdata = launch_op(rt, self.io, "TransData0", self.batch * TRANSDATA_NS_PER_IMAGE, "vector", op_type="TransData",
                              reads=(self.dev_in[b],), writes=(self.dev_5hd[b],))
        if self.serial:
            self.inj.report_serial_bubble(self.io, self.last_kernel, transdata, self.copies,
                                          "resnet50.serve:memcpy+synchronize")
            self.copies = []
        else:
            rt.record_event(self.ev_in[b], self.io)

    def compute_stage(self, i: int) -> None:
        rt, b = self.rt, i % 2
        if not self.serial:
            rt.stream_wait_event(self.comp, self.ev_in[b])
        features = self.inj.step_alloc("resnet50.forward:layer4_features", self.batch * FEATURES_BYTES, self.comp)
        head = len(self.ops) - HEAD_OPS
        access = {0: ((self.dev_5hd[b],), ()), head + 1: ((), (self.logits[b],)),
                  head + 2: ((self.logits[b],), (self.probs[b],))}
        for k, (name, core, ns) in enumerate(self.ops):
            if k == head and self.cfg.on("missing-sync"):
                # The bug: the event marks the backbone's end; the classifier head that writes
                # the logits comes after it, so nothing orders TopKV2 after MatMulV2.
                rt.record_event(self.ev_out[b], self.comp)
            reads, writes = access.get(k, ((), ()))
            corr = launch_op(rt, self.comp, name, ns, core, op_type=self.op_types[name], reads=reads, writes=writes)
            if k == head + 1:
                self.matmul[i] = corr
        if not self.serial and not self.cfg.on("missing-sync"):
            rt.record_event(self.ev_out[b], self.comp)
        self.inj.step_free(features)  # stream-ordered: the cache reuses it only behind this batch
        if i == self.cfg.steps // 2:
            self.inj.fragment(self.comp, "resnet50.forward:activations")

    def output_stage(self, i: int) -> None:
        rt, b = self.rt, i % 2
        if not self.serial:
            rt.stream_wait_event(self.io, self.ev_out[b])
        # Top-5 of the logits (softmax keeps their order), a few blocks: it shares the Vector cores.
        topk = launch_op(rt, self.io, self.topk_name, self.batch * TOPK_NS_PER_IMAGE, "vector", op_type="TopKV2", blocks=self.batch,
                         reads=(self.logits[b],), writes=(self.dev_top[b],))
        self.last_kernel = topk
        if self.cfg.on("missing-sync"):
            self.inj.report_missing_sync(self.matmul[i], topk, self.io, buffer=f"logits[{b}]")
        d2h = rt.memcpy_async(self.host_out[b], self.top_bytes, self.dev_top[b], self.top_bytes,
                              MEMCPY_DEVICE_TO_HOST, self.io)
        if self.serial:
            rt.synchronize_stream(self.io)
            self.copies.append(d2h)
        rt.record_event(self.ev_done[b], self.io)
        if self.cfg.on("launch-bound"):
            rt.synchronize_event(self.ev_done[b])  # the Python loop needs the results on the host
            corrs = self.inj.tiny_ops(self.comp, PER_SAMPLE_OPS * self.batch, "resnet50.postprocess:per_sample_loop")
            self.last_kernel = corrs[-1]
        # After the batch's work is queued, so that it does not hold back this batch's launches.
        self.inj.flood(self.comp, "resnet50.forward:overflow_check")

    def finish(self, i: int) -> None:
        """The host reads batch i's top-5 and turns it into labels."""
        self.rt.synchronize_event(self.ev_done[i % 2])
        self.rt.host_work("postprocess", jittered(self.rt, POSTPROCESS_NS, 0.1))

    def close(self) -> None:
        rt = self.rt
        rt.synchronize_device()
        for ptr in (self.weights, *self.dev_in, *self.dev_5hd, *self.logits, *self.probs, *self.dev_top):
            rt.free(ptr)
        for ptr in (*self.host_in, *self.host_out):
            rt.free_host(ptr)


def program(rt: "Runtime", cfg: Config) -> None:
    srv = _Server(rt, cfg)
    for i in range(cfg.steps):
        with rt.step():
            if srv.serial:  # one batch at a time
                srv.input_stage(i)
                srv.compute_stage(i)
                srv.output_stage(i)
                srv.finish(i)
                continue
            if i == 0:
                srv.input_stage(0)
            if i + 1 < cfg.steps:  # copy the next batch in while this one computes
                srv.input_stage(i + 1)
            srv.compute_stage(i)
            srv.output_stage(i)
            if i >= 1:
                srv.finish(i - 1)
    if not srv.serial:
        srv.finish(cfg.steps - 1)
    srv.close()


def check(cfg: Config) -> None:
    if cfg["batch"] < 1:
        raise ValueError(f"batch must be >= 1, got {cfg['batch']}")


SCENARIO = Scenario(
    name="resnet50-infer", description=__doc__, program=program, switches=frozenset(SWITCHES), default_steps=4,
    params={"batch": Param(int, 16, "images per batch (224x224)", minimum=1)}, check=check,
    size=lambda cfg: EVENTS_PER_STEP * cfg.steps)
