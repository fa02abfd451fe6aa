"""The compiled emulator core: same traces as the pure-Python modules, used only while current,
and public API arguments checked by the runtime (not rejected by compiled code's type checks)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import numpy as np
import pytest

import runtime_emu
from runtime_emu import AclError, Kernel, Runtime
from simcore import _loader

ROOT = Path(__file__).resolve().parents[1]
SAMPLES_DIR = ROOT / "sample_traces" / "emulated"


def _python(code: str, **env: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_compiled_core_is_used_whenever_it_is_current():
    names = _loader.compiled_modules()
    # The install compiles the modules _loader.COMPILED lists (setup.py reads it there).
    assert names in ([], sorted(_loader.COMPILED))
    forced_pure = os.environ.get("MSPROF_PY_PURE") == "1"
    assert runtime_emu.COMPILED == (bool(names) and _loader.stale(names) is None and not forced_pure)
    if runtime_emu.COMPILED:
        assert runtime_emu.runtime.__file__.endswith(EXTENSION_SUFFIXES[0])


def test_pure_python_emulator_writes_byte_identical_sample_traces(tmp_path):
    """The committed samples are what the in-process emulator (compiled where built) writes,
    checked in test_emu_scenarios_multirank; the pure-Python modules must write the same bytes."""
    out = _python("import sys, runtime_emu\nfrom runtime_emu.scenarios import samples\n"
                  f"samples.generate({str(tmp_path)!r})\nprint(runtime_emu.COMPILED)", MSPROF_PY_PURE="1")
    assert out.strip().splitlines()[-1] == "False"
    committed = sorted(p.relative_to(SAMPLES_DIR) for p in SAMPLES_DIR.rglob("*") if p.is_file())
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert fresh == committed and len(committed) == 69
    for rel in committed:
        assert (tmp_path / rel).read_bytes() == (SAMPLES_DIR / rel).read_bytes(), rel


def _fake_packages(tmp_path: Path, sources: dict[str, str], record: dict | None) -> Path:
    """A root holding packages with the dotted modules `sources`, each built (an extension module
    beside it), a source without one, and the build's record."""
    for name, text in sources.items():
        path = _loader.source(name, tmp_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.with_name(f"{path.stem}{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
        (path.parent / "lonely.py").write_text("x = 1\n")  # a source without an extension: not compiled
    if record is not None:
        (tmp_path / "simcore").mkdir(exist_ok=True)
        (tmp_path / _loader.RECORD).write_text(json.dumps(record))
    return tmp_path


def test_setup_compiles_the_loaders_list():
    """setup.py reads the list from _loader.py's text; it must read the same tuple."""
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text())
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_compiled_list"]
    namespace = {"ROOT": ROOT, "ast": ast, "sys": sys}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), "setup.py", "exec"), namespace)
    assert namespace["_compiled_list"]() == _loader.COMPILED
    assert "COMPILED = _compiled_list()" in (ROOT / "setup.py").read_text()


def test_loader_rejects_compiled_modules_older_than_their_sources(tmp_path):
    sources = {"simcore.engine": "a = 1\n", "runtime_emu.runtime": "b = 2\n"}
    digest = {n: hashlib.sha256(t.encode()).hexdigest() for n, t in sources.items()}
    root = _fake_packages(tmp_path, sources, {"sources": digest})
    names = ["runtime_emu.runtime", "simcore.engine"]
    assert _loader.compiled_modules(root, tuple(sources)) == names
    assert _loader.stale(names, root) is None
    (root / "runtime_emu" / "runtime.py").write_text("b = 3\n")  # edited after the build
    assert _loader.stale(names, root) == "runtime_emu/runtime.py changed since they were built"
    (root / _loader.RECORD).write_text("{not json")
    assert _loader.stale(["simcore.engine"], root) == "no record of the sources they were built from"
    (root / _loader.RECORD).unlink()
    assert _loader.stale(["simcore.engine"], root) == "no record of the sources they were built from"


def test_forcing_pure_python_is_silent_and_reports_it():
    out = _python("import warnings\nwarnings.simplefilter('error')\nimport runtime_emu\n"
                  "print(runtime_emu.COMPILED, runtime_emu.runtime.__file__.endswith('.py'))", MSPROF_PY_PURE="1")
    assert out.split() == ["False", "True"]


K = Kernel("MatMul", block_ns=1_000, core="cube")


def test_numpy_integers_are_accepted_where_ints_are():
    rt = Runtime(seed=0)
    rt.set_device(np.int64(0))
    stream = rt.create_stream(priority=np.int32(3))
    corr = rt.launch_kernel(K, np.int64(40), stream)
    ptr = rt.malloc(np.int64(4096))
    rt.synchronize_device()
    rt.free(ptr)
    assert (stream.priority, type(stream.priority)) == (3, int)
    assert rt.gt_tasks[0][0] == corr
    table = rt.finish().trace.table.to_pandas()
    kernel = table[table.kind == "kernel"].iloc[0]
    assert (kernel["name"], kernel["dur"], kernel["args"]) == (
        "MatMul", 2_000, '{"Task Type":"AI_CORE","Stream Id":1,"Task Id":1,"Block Dim":40,"Waves":2,"OP Type":"MatMul"}')


@pytest.mark.parametrize("call, message", [
    (lambda rt, s: rt.launch_kernel(K, 2.5, s), "ACL_ERROR_RT_PARAM_INVALID.*numBlocks must be an integer, got 2.5"),
    (lambda rt, s: rt.launch_kernel(K, "8", s), "numBlocks must be an integer, got '8'"),
    (lambda rt, s: rt.launch_kernel("MatMul", 8, s), "ACL_ERROR_RT_INVALID_HANDLE.*invalid kernel handle 'MatMul'"),
    (lambda rt, s: rt.launch_kernel(K, 8, "stream1"), "invalid stream handle 'stream1'"),
    (lambda rt, s: rt.create_stream(priority=1.0), "priority must be an integer, got 1.0"),
    (lambda rt, s: rt.malloc(None), "size must be an integer, got None"),
    (lambda rt, s: rt.malloc_host(64.0), "size must be an integer, got 64.0"),
    (lambda rt, s: rt.memcpy_async(0, 64, 0, "64", 1, s), "count must be an integer, got '64'"),
    (lambda rt, s: rt.memset_async(0, 64.0, 0, 64, s), "maxCount must be an integer, got 64.0"),
    (lambda rt, s: rt.record_event(7, s), "invalid event handle 7"),
    (lambda rt, s: rt.stream_wait_event(s, None), "invalid event handle None"),
    (lambda rt, s: rt.synchronize_stream(3), "invalid stream handle 3"),
    (lambda rt, s: rt.set_device("0"), "device '0' does not exist"),
])
def test_wrong_argument_types_raise_the_runtime_error_not_a_type_error(call, message):
    rt = Runtime(seed=0)
    rt.set_device(0)
    stream = rt.create_stream()
    with pytest.raises(AclError, match=message):
        call(rt, stream)


def _engine_log(engine) -> list:
    """Callbacks that schedule more callbacks, with many ties in time, run to the end."""
    import random

    rng = random.Random(7)
    log: list = []

    def callback(arg: int) -> None:
        log.append((engine.now, arg))
        if len(log) < 3000:
            for k in range(rng.randint(0, 2)):
                engine.after(rng.choice((0, 0, 5, 17, 100)), callback, arg * 3 + k)

    for i in range(60):
        engine.at(rng.randint(0, 200), callback, i)
    engine.run_until(150)
    log.append(("run_until", engine.now, len(engine), engine.next_time()))
    engine.step()
    engine.run_while(lambda: len(log) < 500)
    log.append(("run_while", engine.now, len(engine)))
    engine.run()
    return log


def _pulses(engine) -> list[int]:
    """The times of the pulses of 1000 callbacks, 100 run by run_until, 800 by run_while."""
    pulses: list[int] = []
    engine.pulse = lambda: pulses.append(engine.now)
    for t in range(1000):
        engine.at(t, lambda _arg: None)
    engine.run_until(99)
    engine.run_while(lambda: engine.now < 899)
    engine.run()
    return pulses


def test_the_event_heap_runs_callbacks_in_time_then_scheduling_order():
    from simcore import engine as eng

    log = _engine_log(eng.Engine())
    assert len(log) > 3000
    times = [entry[0] for entry in log if isinstance(entry[0], int)]
    assert times == sorted(times)
    # Ties run in the order they were scheduled; a past time runs now.
    engine = eng.Engine()
    order: list = []
    engine.at(10, order.append, "a")
    engine.at(5, order.append, "b")
    engine.at(10, order.append, "c")
    engine.run_until(7)
    engine.at(0, order.append, "d")
    engine.after(3, order.append, "e")
    engine.run()
    assert (order, engine.now, len(engine), engine.next_time()) == (["b", "d", "a", "c", "e"], 10, 0, None)
    # pulse() is called every PULSE_EVENTS callbacks of a run_while, and only there.
    assert _pulses(eng.Engine()) == [99 + eng.PULSE_EVENTS, 99 + 2 * eng.PULSE_EVENTS, 99 + 3 * eng.PULSE_EVENTS]
