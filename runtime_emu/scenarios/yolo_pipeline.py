"""YOLOv5s object detection on a video/image stream, one 640x640 image per step, as a three-stage
pipeline: host preprocessing (JPEG decode, resize, letterbox and normalise, ~1.7 ms), the device
model (H2D of the fp16 image, ~90 kernels: Conv2D with its SiLU fused on the Cube cores, Add,
ConcatD, MaxPoolV3, ResizeNearestNeighborV2 and Sigmoid on the Vector cores, then a ConcatD of the
three detection heads and the D2H of the 25200x85 predictions) and host NMS (~0.35 ms). With
`triple_buffer` (the default) three buffer slots and three streams (input copy, compute, output)
joined by events let the host preprocess image i+1 and run NMS on image i-1 while the device
computes image i; without it every stage waits for the previous one, preprocessing is about a third
of each step (35% in the seeds' YOLOv5 case) and the Cube cores idle through it and through NMS;
with it the host work fits under the device time, so those stalls all but vanish (the seeds report
-42% with triple buffering) and throughput rises ~1.8x (seeds: 128 -> 211 qps). Switches:
predictions kept every step (leak), a burst of interleaved activations (fragmentation), an
eager-mode Detect decode loop of tiny ops (launch-bound), one stream with a synchronize after each
copy (serial-copies, which also turns triple buffering off), the heads' event recorded before their
in-place Sigmoids so that ConcatD reads a head while it is being written (missing-sync, needs triple
buffering), an IsFinite check per tensor on a side stream (queue-congestion) and a prefetch sharing
the input copy's PCIe direction (bandwidth-contention).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runtime_emu.runtime import MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE
from runtime_emu.scenarios.problems import SWITCHES, Injector
from runtime_emu.scenarios.scenario import Config, Param, Scenario, jittered, launch_op

if TYPE_CHECKING:
    from runtime_emu.runtime import Runtime

# Host stages, DEFAULTS chosen so that preprocessing is ~35% of the serial step as in the seeds.
DECODE_NS, RESIZE_NS, LETTERBOX_NS = 1_000_000, 450_000, 250_000
NMS_NS = 350_000
MODEL_NS = 2_600_000  # DEFAULT: YOLOv5s at 640x640, batch 1, on a 910B-class NPU (not measured)
CONCAT_NS = 30_000  # DEFAULT
WEIGHT_BYTES = 7_225_885 * 2  # YOLOv5s parameters in fp16
IN_BYTES = 3 * 640 * 640 * 2  # the letterboxed image, NCHW fp16
PRED_BYTES = 25_200 * 85 * 2  # (80x80 + 40x40 + 20x20) x 3 anchors x (4 box + 1 obj + 80 classes), fp16
HEAD_BYTES = tuple(side * side * 3 * 85 * 2 for side in (80, 40, 20))  # the three detection heads' outputs
COUNT_BYTES = 8  # the launch-bound decode loop's read: one int64
HEAD_OPS = 6  # three head Conv2D (each writes its head's output), then three in-place Sigmoid
# DEFAULTS: the heads' tensors are small, so these kernels use part of the 40 Vector cores and
# the output stream's ConcatD can run beside a Sigmoid.
SIGMOID_BLOCKS, CONCAT_BLOCKS = 16, 8
SLOTS = 3
EVENTS_PER_STEP = 620  # trace events of a healthy step (measured)
#: Eager-mode Detect decode (launch-bound): per scale and anchor, (aten op, NPU op type).
DECODE_OPS = [("aten::sigmoid", "Sigmoid"), ("aten::mul", "Mul"), ("aten::add", "Add"), ("aten::pow", "Pow"),
              ("aten::mul", "Mul"), ("aten::cat", "ConcatD")] * 9


def model_ops() -> list[tuple[str, str, float]]:
    """YOLOv5s's forward pass as (op type, core, relative cost); each Conv2D carries its SiLU.

    The relative costs are DEFAULTS (rough shares of FLOPs and bytes moved), not measurements.
    """
    def conv(cost: float = 1.0) -> tuple[str, str, float]:
        return ("Conv2D", "cube", cost)

    concat, add = ("ConcatD", "vector", 0.1), ("Add", "vector", 0.1)

    def c3(n: int, shortcut: bool = True) -> list[tuple[str, str, float]]:
        ops = [conv(0.5), conv(0.5)]
        for _ in range(n):
            ops += [conv(0.5), conv(1.0)] + ([add] if shortcut else [])
        return ops + [concat, conv(0.8)]

    up = ("ResizeNearestNeighborV2", "vector", 0.15)
    backbone = [conv(1.5), conv(1.5), *c3(1), conv(1.2), *c3(2), conv(1.2), *c3(3), conv(1.2), *c3(1)]
    sppf = [conv(0.5), *[("MaxPoolV3", "vector", 0.15)] * 3, concat, conv(0.8)]
    neck = [conv(0.5), up, concat, *c3(1, False), conv(0.5), up, concat, *c3(1, False),
            conv(1.0), concat, *c3(1, False), conv(1.0), concat, *c3(1, False)]
    head = [conv(0.3)] * 3 + [("Sigmoid", "vector", 0.1)] * 3
    return backbone + sppf + neck + head


class _Pipeline:
    def __init__(self, rt: "Runtime", cfg: Config) -> None:
        self.rt, self.cfg = rt, cfg
        self.inj = Injector(rt, cfg)
        # serial-copies means one stream with a synchronize after each copy: no pipelining.
        self.pipelined = cfg["triple_buffer"] and not cfg.on("serial-copies")
        rt.set_device(0)
        if self.pipelined:
            self.s_in, self.s_comp, self.s_out = (rt.create_stream() for _ in range(3))
        else:
            self.s_in = self.s_comp = self.s_out = rt.create_stream()
        slots = SLOTS if self.pipelined else 1
        ops = model_ops()
        scale = MODEL_NS / sum(cost for _, _, cost in ops)
        self.ops = [(f"{op}{i}", core, cost * scale) for i, (op, core, cost) in enumerate(ops)]
        self.op_types = {f"{op}{i}": op for i, (op, _, _) in enumerate(ops)}  # msprof's OP Type
        self.concat_name = f"ConcatD{len(ops)}"  # torch_npu-style: op type + graph index
        self.weights = rt.malloc(WEIGHT_BYTES)
        self.host_in = [rt.malloc_host(IN_BYTES) for _ in range(slots)]
        self.dev_in = [rt.malloc(IN_BYTES) for _ in range(slots)]
        self.host_out = [rt.malloc_host(PRED_BYTES) for _ in range(slots)]
        # Only the launch-bound decode loop reads a count back; the healthy program allocates nothing for it.
        self.host_count = rt.malloc_host(COUNT_BYTES) if self.cfg.on("launch-bound") else None
        self.heads = [tuple(rt.malloc(n) for n in HEAD_BYTES) for _ in range(slots)]
        self.ev_in, self.ev_out, self.ev_done = ([rt.create_event() for _ in range(slots)] for _ in range(3))
        self.slots = slots
        self.pred: dict[int, int] = {}  # image -> its predictions buffer (device, caching allocator)
        self.last_kernel: int | None = None
        self.last_sigmoid = 0  # corr of the last head Sigmoid (the producer missing-sync races)
        self.copies: list[int] = []  # copies since the last kernel (serial-copies)

    def preprocess(self) -> None:
        rt = self.rt
        # Reading and decoding the JPEG is data loading; its size varies image to image.
        rt.host_work("decode", jittered(rt, DECODE_NS, 0.15), kind="data_load")
        rt.host_work("resize", jittered(rt, RESIZE_NS, 0.1))
        rt.host_work("letterbox", jittered(rt, LETTERBOX_NS, 0.1))

    def submit(self, i: int) -> None:
        """Copy image i in, run the model, assemble and copy out its predictions."""
        rt, inj, b = self.rt, self.inj, i % self.slots
        serial_copies = self.cfg.on("serial-copies")
        report = inj.contend(self.s_in, IN_BYTES)
        h2d = rt.memcpy_async(self.dev_in[b], IN_BYTES, self.host_in[b], IN_BYTES, MEMCPY_HOST_TO_DEVICE, self.s_in)
        report(h2d)
        if serial_copies:
            rt.synchronize_stream(self.s_in)
            self.copies.append(h2d)
        if self.pipelined:
            rt.record_event(self.ev_in[b], self.s_in)
            rt.stream_wait_event(self.s_comp, self.ev_in[b])
        pred = self.pred[i] = inj.step_alloc("yolov5.detect:predictions", PRED_BYTES, self.s_out)
        corrs = self.model(b)
        if serial_copies:
            inj.report_serial_bubble(self.s_comp, self.last_kernel, corrs[0], self.copies,
                                     "yolov5.submit:memcpy+synchronize")
            self.copies = []
        if self.pipelined:
            if not self.cfg.on("missing-sync"):  # with it, ev_out was recorded inside model()
                rt.record_event(self.ev_out[b], self.s_comp)
            rt.stream_wait_event(self.s_out, self.ev_out[b])
        concat = self.last_kernel = launch_op(rt, self.s_out, self.concat_name, CONCAT_NS, "vector", CONCAT_BLOCKS, op_type="ConcatD",
                                              reads=self.heads[b], writes=(pred,))
        if self.cfg.on("missing-sync"):
            inj.report_missing_sync(self.last_sigmoid, concat, self.s_out, buffer=f"detect head P5[{b}]")
        d2h = rt.memcpy_async(self.host_out[b], PRED_BYTES, pred, PRED_BYTES, MEMCPY_DEVICE_TO_HOST, self.s_out)
        if serial_copies:
            rt.synchronize_stream(self.s_out)
            self.copies.append(d2h)
        if self.pipelined:
            rt.record_event(self.ev_done[b], self.s_out)
        # What the switches add once the image's work is queued.
        if self.cfg.on("launch-bound"):
            # The Python decode loop reads a count off the device first (`.item()`: a small D2H copy, then
            # a synchronize), so its tiny ops start once the network has run.
            rt.memcpy_async(self.host_count, COUNT_BYTES, self.heads[b][-1], COUNT_BYTES, MEMCPY_DEVICE_TO_HOST,
                            self.s_comp)
            rt.synchronize_stream(self.s_comp)
            self.last_kernel = inj.tiny_ops(self.s_comp, DECODE_OPS, "yolov5.detect:eager_decode")[-1]
        if i == self.cfg.steps // 2:
            inj.fragment(self.s_comp, "yolov5.forward:activations")
        inj.flood(self.s_comp, "yolov5.forward:overflow_check")

    def model(self, b: int) -> list[int]:
        """Launch the network on slot b's input; returns the kernels' correlation ids."""
        rt, head = self.rt, len(self.ops) - HEAD_OPS
        corrs = []
        for k, (name, core, ns) in enumerate(self.ops):
            blocks: int | None = None
            reads: tuple[int, ...] = ()
            writes: tuple[int, ...] = ()
            if k == 0:
                reads = (self.dev_in[b],)
            elif head <= k < head + 3:
                writes = (self.heads[b][k - head],)
            elif k >= head + 3:
                blocks, reads = SIGMOID_BLOCKS, (self.heads[b][k - head - 3],)
                writes = reads
                if k == head + 3 and self.cfg.on("missing-sync"):
                    # The bug: the event is recorded after the head convolutions but before the
                    # in-place Sigmoids, so nothing orders ConcatD after them.
                    rt.record_event(self.ev_out[b], self.s_comp)
            corrs.append(launch_op(rt, self.s_comp, name, ns, core, blocks, op_type=self.op_types[name], reads=reads,
                                   writes=writes))
        self.last_sigmoid = corrs[-1]
        return corrs

    def postprocess(self, i: int) -> None:
        """NMS on image i's predictions once they are on the host."""
        rt = self.rt
        if self.pipelined:
            rt.synchronize_event(self.ev_done[i % self.slots])
        else:
            rt.synchronize_stream(self.s_out)
        self.inj.step_free(self.pred.pop(i))
        rt.host_work("nms", jittered(rt, NMS_NS, 0.2))  # candidate count varies with the scene

    def close(self) -> None:
        rt = self.rt
        rt.synchronize_device()
        for ptr in (self.weights, *self.dev_in, *(p for heads in self.heads for p in heads)):
            rt.free(ptr)
        for ptr in (*self.host_in, *self.host_out):
            rt.free_host(ptr)
        if self.host_count is not None:
            rt.free_host(self.host_count)


def program(rt: "Runtime", cfg: Config) -> None:
    pipe = _Pipeline(rt, cfg)
    if not pipe.pipelined:
        for i in range(cfg.steps):
            with rt.step():
                pipe.preprocess()
                pipe.submit(i)
                pipe.postprocess(i)
        pipe.close()
        return
    # Software-pipelined: while the device runs image i the host prepares image i+1, then runs NMS
    # on image i-1 (its slot is then free again). Image 0 is prepared before the first step, as a
    # video pipeline has its first frame decoded before the steady state the profiler records.
    pipe.preprocess()
    for i in range(cfg.steps):
        with rt.step():
            pipe.submit(i)
            if i + 1 < cfg.steps:
                pipe.preprocess()
            if i >= 1:
                pipe.postprocess(i - 1)
    pipe.postprocess(cfg.steps - 1)
    pipe.close()


def check(cfg: Config) -> None:
    if cfg.on("missing-sync") and not cfg["triple_buffer"]:
        raise ValueError("missing-sync needs triple_buffer=True: without it every stage is on one stream, "
                         "so there is no cross-stream event to miss")


SCENARIO = Scenario(
    name="yolo-pipeline", description=__doc__, program=program, switches=frozenset(SWITCHES), default_steps=6,
    params={"triple_buffer": Param(bool, True, "three buffer slots and streams overlap preprocessing, the device and "
                                                "NMS; false: the serial baseline, every stage waits for the last")},
    check=check, size=lambda cfg: EVENTS_PER_STEP * cfg.steps)
