"""Max-min fair link sharing and the event loop, checked against hand-worked schedules."""

from __future__ import annotations

from simcore.engine import Engine
from simcore.links import Link, Network


def run_flows(specs, links):
    """specs: (start_ns, path, bytes, name); returns {name: end_ns}."""
    eng = Engine()
    net = Network(eng)
    ends = {}
    for start, path, nbytes, name in specs:
        eng.at(start, lambda arg: net.transfer(arg[0], arg[1], lambda n: ends.__setitem__(n, eng.now), arg[2]),
               (path, nbytes, name))
    eng.run()
    return ends


def test_three_equal_flows_at_once_each_get_a_third():
    link = Link("pcie", 10.0)  # 10 B/ns
    ends = run_flows([(0, (link,), 1_000_000, n) for n in "abc"], [link])
    # Alone 100 us each; sharing a third of the link, all three end at 300 us.
    assert ends == {"a": 300_000, "b": 300_000, "c": 300_000}


def test_two_links_bottleneck_and_water_filling():
    # f1 crosses x (10 B/ns) and y (4 B/ns); f2 only x. f1 is held to 4 B/ns by y, so max-min
    # gives f2 the 6 B/ns left on x, not an equal 5.
    x, y = Link("x", 10.0), Link("y", 4.0)
    ends = run_flows([(0, (x, y), 400_000, "f1"), (0, (x,), 600_000, "f2")], [x, y])
    assert ends == {"f1": 100_000, "f2": 100_000}


def test_a_finishing_flow_hands_its_share_back():
    link = Link("hbm", 2.0)
    ends = run_flows([(0, (link,), 100, "short"), (0, (link,), 300, "long")], [link])
    # Both at 1 B/ns until short ends at 100; long has 200 left, alone at 2 B/ns: 100 more.
    assert ends == {"short": 100, "long": 200}


def test_latency_delays_the_first_byte():
    link = Link("roce", 25.0, latency_ns=10_000)
    assert run_flows([(0, (link,), 25_000, "f")], [link]) == {"f": 11_000}


def test_rate_changes_are_reported_to_the_link_listener():
    link = Link("pcie", 10.0)
    seen = []
    link.on_rate = lambda lk, now, rate: seen.append((now, rate))
    run_flows([(0, (link,), 1_000, "a"), (50, (link,), 1_000, "b")], [link])
    # The link stays fully used while either flow runs (shares move, the total does not).
    assert seen == [(0, 10.0), (200, 0.0)]


def test_engine_runs_ties_in_scheduling_order():
    eng = Engine()
    log = []
    for name in "abc":
        eng.at(5, log.append, name)
    eng.at(1, log.append, "first")
    eng.run()
    assert log == ["first", "a", "b", "c"] and eng.now == 5
