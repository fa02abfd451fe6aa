"""Links shared by concurrent flows with max-min fair bandwidth.

A flow moves `bytes` along a path of links. Whenever a flow starts or ends, the rates of all
flows are recomputed by progressive filling (max-min fairness): this is what makes
contention real, e.g. two equal H2D copies at once each take twice as long as one alone.
"""

from __future__ import annotations

from typing import Any, Callable

from simcore.engine import Clock


class Link:
    """A shared channel: PCIe (per direction), HBM, HCCS, RoCE..."""

    __slots__ = ("name", "bytes_per_ns", "latency_ns", "flows", "index", "in_use", "on_rate")

    def __init__(self, name: str, gbps: float, latency_ns: int = 0) -> None:
        if gbps <= 0:
            raise ValueError(f"link {name!r}: bandwidth must be positive, got {gbps} GB/s")
        self.name = name
        self.bytes_per_ns = gbps  # 1 GB/s == 1 byte/ns
        self.latency_ns = latency_ns
        # A dict, not a set: iteration in insertion order keeps runs deterministic (a set of
        # objects iterates in address order, which changes from run to run).
        self.flows: dict[Flow, None] = {}
        self.index = -1
        self.in_use = 0.0  # bytes/ns currently allocated
        #: Called with (link, now_ns, gbps_in_use) when the allocated bandwidth changes.
        self.on_rate: Callable[[Link, int, float], None] | None = None

    @property
    def gbps(self) -> float:
        return self.bytes_per_ns

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self.bytes_per_ns} GB/s)"


class Flow:
    __slots__ = ("path", "bytes", "remaining", "rate", "last_ns", "version", "on_done", "arg",
                 "start_ns", "alone_ns")

    def __init__(self, path: tuple[Link, ...], nbytes: int, on_done: Callable[[Any], None], arg: Any) -> None:
        self.path = path
        self.bytes = nbytes
        self.remaining = float(nbytes)
        self.rate = 0.0
        self.last_ns = 0
        self.version = 0
        self.on_done = on_done
        self.arg = arg
        self.start_ns = 0
        #: How long the transfer would take with the path to itself (latency excluded).
        self.alone_ns = 0


class Network:
    """All links and active flows of one emulation."""

    def __init__(self, engine: Clock) -> None:
        self.engine = engine
        self.flows: dict[Flow, None] = {}

    def transfer(self, path: tuple[Link, ...], nbytes: int, on_done: Callable[[Any], None], arg: Any = None) -> Flow:
        """Move nbytes along path; on_done(arg) runs when the last byte arrives."""
        flow = Flow(path, nbytes, on_done, arg)
        flow.start_ns = self.engine.now
        slowest = min(link.bytes_per_ns for link in path)
        flow.alone_ns = int(-(-nbytes // slowest)) if nbytes else 0
        latency = max(link.latency_ns for link in path)
        if latency:
            self.engine.after(latency, self._enter, flow)
        else:
            self._enter(flow)
        return flow

    def _enter(self, flow: Flow) -> None:
        if flow.remaining <= 0:
            flow.on_done(flow.arg)
            return
        flow.last_ns = self.engine.now
        self.flows[flow] = None
        for link in flow.path:
            link.flows[flow] = None
        self._reshare(flow.path)

    def _finish(self, token: tuple[Flow, int]) -> None:
        flow, version = token
        if version != flow.version:
            return  # superseded by a later rate change
        flow.remaining = 0.0
        self.flows.pop(flow, None)
        for link in flow.path:
            link.flows.pop(flow, None)
        self._reshare(flow.path)
        flow.on_done(flow.arg)

    def _reshare(self, touched: tuple[Link, ...]) -> None:
        """Recompute max-min fair rates for every flow connected to the touched links."""
        now = self.engine.now
        # The connected component of flows sharing links with the change: only their rates move.
        links: dict[Link, None] = dict.fromkeys(touched)
        flows: dict[Flow, None] = {}
        frontier = list(touched)
        while frontier:
            link = frontier.pop()
            for f in link.flows:
                if f not in flows:
                    flows[f] = None
                    for other in f.path:
                        if other not in links:
                            links[other] = None
                            frontier.append(other)
        for f in flows:
            if f.rate:
                f.remaining -= f.rate * (now - f.last_ns)
            f.last_ns = now
        rates = _max_min(flows, links)
        for link in links:
            used = sum(rates[f] for f in link.flows)
            if used != link.in_use:
                link.in_use = used
                if link.on_rate is not None:
                    link.on_rate(link, now, used)
        for f in flows:
            rate = rates[f]
            if rate == f.rate and f.version:
                continue
            f.rate = rate
            f.version += 1
            remaining = max(f.remaining, 0.0)
            done_in = int(-(-remaining // rate)) if remaining > 1e-9 else 0
            self.engine.at(now + done_in, self._finish, (f, f.version))


def _max_min(flows: dict[Flow, None], links: dict[Link, None]) -> dict[Flow, float]:
    """Progressive filling: raise all rates together; freeze flows at their bottleneck link."""
    residual = {link: link.bytes_per_ns for link in links}
    unfrozen = {link: {f: None for f in link.flows if f in flows} for link in links}
    rates: dict[Flow, float] = {}
    active = set(flows)
    while active:
        share, bottleneck = min(
            ((residual[link] / len(fs), link) for link, fs in unfrozen.items() if fs),
            key=lambda x: (x[0], x[1].name),
        )
        for f in list(unfrozen[bottleneck]):
            rates[f] = share
            active.discard(f)
            for link in f.path:
                residual[link] -= share
                unfrozen[link].pop(f, None)
    return rates
