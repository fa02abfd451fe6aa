"""Ground truth: what the emulator knows caused each delay, for tests and evaluation only.

Every finished device task leaves why it started when it did (the host had not launched it,
its stream was busy, it waited for an event or for cores); every host call that held its
thread leaves why. Scenarios add the problems they injected. This goes to
`ground_truth.json`, never to the trace the analyzers read.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from runtime_emu.recorder import StringCodes, new_buffer

#: The fields recorded per finished device task.
#: `record` is the correlation id of an event record: for a wait, the record it captured (None:
#: the event had none); for a task a wait held back (cause "event"), the record that wait waited
#: for; None for every other task.
TASK_FIELDS = ("corr", "rank", "device", "stream", "kind", "name", "launch_ns", "arrive_ns", "ready_ns", "start_ns",
               "end_ns", "cause", "producer", "queue_blocked_ns", "record")
#: TASK_FIELDS holding text: kept as codes into GroundTruth.codes.
TEXT_FIELDS: Final = frozenset(("kind", "name", "cause", "producer"))
#: A task's TASK_FIELDS go into GroundTruth.tasks as one row of int64s (texts as codes, no
#: record as NO_RECORD; the dispatcher appends it): a row costs less to add than 15 references
#: and their ints to a list, and the list was the one large object the garbage collector walked
#: at every full collection.
NO_RECORD: Final = -1
#: The fields recorded per host block: a call that held its thread (full queue, copy, synchronize).
HOST_BLOCK_FIELDS = ("rank", "thread", "start_ns", "end_ns", "reason", "stream", "corr")
SCHEMA = 1


class GroundTruth:
    """What one run knows of its causes; the dispatcher and the API calls append to the lists."""

    def __init__(self, seed: int, keep: bool = True) -> None:
        self.seed = seed
        #: False: nothing is kept per task, host block or collective (a large run streamed to
        #: Parquet, whose memory must not grow with its length); the document has empty lists.
        self.keep = keep
        #: TASK_FIELDS values per finished task as int64 rows, in finish order.
        self.tasks: Any = new_buffer("truth")
        #: text -> code of the text fields (a new text gets the next code).
        self.codes = StringCodes()
        #: HOST_BLOCK_FIELDS tuples, in the order the blocks ended.
        self.host_blocks: list[tuple] = []
        #: The problems a scenario injected, as it reports them.
        self.problems: list[dict[str, Any]] = []

    def column(self, field_name: str) -> list[Any]:
        """One TASK_FIELDS column, in finish order."""
        i = TASK_FIELDS.index(field_name)
        if not self.tasks:
            return []
        # A view for as long as this line runs: the buffer may grow again afterwards.
        values = np.frombuffer(self.tasks, dtype=np.int64)[i::len(TASK_FIELDS)].tolist()
        if field_name in TEXT_FIELDS:
            texts = list(self.codes)
            return [texts[v] for v in values]
        if field_name == "record":
            return [None if v == NO_RECORD else v for v in values]
        return values

    def task_rows(self) -> list[tuple]:
        """Ground truth per finished task, as tuples in TASK_FIELDS order (finish order)."""
        return list(zip(*(self.column(c) for c in TASK_FIELDS)))

    def task_log(self) -> list[tuple]:
        """(name, stream, start_ns, end_ns) per finished task, in finish order."""
        return list(zip(*(self.column(c) for c in ("name", "stream", "start_ns", "end_ns"))))

    def as_dict(self, hccl: dict[str, Any] | None) -> dict[str, Any]:
        """The ground_truth.json document (`hccl`: the collectives' own, if any ran)."""
        tasks = {c: self.column(c) for c in TASK_FIELDS}
        blocks = ({c: list(v) for c, v in zip(HOST_BLOCK_FIELDS, zip(*self.host_blocks))} if self.host_blocks
                  else {c: [] for c in HOST_BLOCK_FIELDS})
        return {"schema": SCHEMA, "seed": self.seed, "problems": list(self.problems), "tasks": tasks,
                "host_blocks": blocks, "hccl": hccl}
