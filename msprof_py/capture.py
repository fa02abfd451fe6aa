"""Capture: run a program (or a built-in scenario) with profiling on, and lay out its PROF dir.

    capture(["python", "app.py"], "profiling", Switches(hccl=False))   # msprof-py --application=...
    emulate("yolo-pipeline", "profiling", problems=["leak"])           # msprof-py emulate ...

The program runs as a child process, unchanged: the environment tells its `acl.init()` which
switches to record (MSPROF_PY_EMU_CONFIG) and the capture agent where to save
(MSPROF_PY_CAPTURE_DIR, a staging directory inside the PROF dir), and a `sitecustomize` first
on its PYTHONPATH hooks the agent into `acl.on_init` (see `capture_agent`). When the child
ends, however it ends, the staging data becomes the PROF dir's raw data and exports, and status.json / README.txt
say whether the run is complete and, if not, why.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from msprof_py import __version__, prof_dir
from msprof_py.capture_agent import BOOT_DIR, ENV_DIR, ENV_FLUSH_S
from msprof_py.errors import MsprofError
from msprof_py.loading import progress_reporter
from msprof_py.trace import read_trace
from runtime_emu.recorder import Switches

ENV_CONFIG = "MSPROF_PY_EMU_CONFIG"
#: Trace events above which an emulated run on the pure-Python core is worth a warning: about
#: 100k device tasks (each brings its launch, flow and counter rows), tens of seconds pure.
LARGE_RUN_EVENTS = 1_000_000
_PYTHON_NAMES = ("python", "python3")


@dataclass
class CaptureResult:
    exit_code: int
    runs: list[Path]


# ---------------------------------------------------------------------- the application
def parse_application(application: str | Iterable[str]) -> list[str]:
    """The argv to run, vetted: a bare `python` / `python3` runs under msprof-py's own
    interpreter (so the emulator is importable without activating a venv), a `.py` first word is
    run by it, and a missing, non-executable or empty program is a MsprofError."""
    if isinstance(application, str):
        try:
            argv = shlex.split(application)
        except ValueError as exc:
            raise MsprofError(f"--application: cannot parse {application!r} ({exc})") from None
    else:
        argv = list(application)
    if not argv or not argv[0].strip():
        raise MsprofError("--application is empty", hint='give the program to run, e.g. --application="python app.py"')
    prog = argv[0]
    if prog.endswith(".py"):
        argv = [sys.executable, *argv]
    elif prog in _PYTHON_NAMES:
        argv = [sys.executable, *argv[1:]]
    elif "/" in prog:
        path = Path(prog)
        if not path.exists():
            raise MsprofError(f"{prog}: no such file")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise MsprofError(f"{prog}: not an executable file", hint="chmod +x it, or run it with an interpreter")
    elif shutil.which(prog) is None:
        raise MsprofError(f"{prog}: command not found")
    if Path(argv[0]).resolve() == Path(sys.executable).resolve():
        _check_python_args(argv[1:])
    return argv


def _check_python_args(args: list[str]) -> None:
    """The script of a `python [options] script.py ...` command line must exist."""
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-c", "-m") or a == "-":
            return  # code or a module: nothing on disk to check
        if a.startswith("-"):
            i += 2 if a in ("-W", "-X") else 1
            continue
        path = Path(a)
        if not path.is_file():
            raise MsprofError(f"{a}: no such file" if not path.exists() else f"{a}: not a file",
                              hint="the script named in --application must exist")
        return
    raise MsprofError("--application runs python without a script", hint='e.g. --application="python app.py"')


def capture(argv: list[str], output: str | Path, switches: Switches | None = None, *,
            flush_s: float | None = None) -> CaptureResult:
    """Run argv with profiling on; returns its exit code and the PROF dir(s) written.

    One PROF dir per runtime session (acl.init ... acl.finalize) of the program; a program that
    never starts the runtime still gets one, saying so.
    """
    switches = switches or Switches()
    argv = parse_application(argv)
    prof = prof_dir.new_prof_dir(output)
    staging = prof / prof_dir.STAGING_DIR
    staging.mkdir()
    env = dict(os.environ)
    config = json.loads(env.get(ENV_CONFIG) or "{}")
    config["switches"] = asdict(switches)
    env[ENV_CONFIG] = json.dumps(config)
    env[ENV_DIR] = str(staging.resolve())
    # Every Python process of the program (children included) starts the agent from there.
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT_DIR), *filter(None, [env.get("PYTHONPATH")])])
    if flush_s is not None:
        env[ENV_FLUSH_S] = str(flush_s)
    prof_dir.write_status(prof, {
        "status": prof_dir.RUNNING, "reasons": [], "source": "application", "command": shlex.join(argv),
        "switches": asdict(switches), "started": prof_dir.now_iso(), "capture_pid": os.getpid(),
        "msprof_py": __version__})
    prof_dir.write_readme(prof)
    try:
        child = subprocess.Popen(argv, env=env)
    except OSError as exc:
        shutil.rmtree(prof, ignore_errors=True)
        raise MsprofError(f"{argv[0]}: cannot run ({exc.strerror or exc})") from None
    prof_dir.update_status(prof, program_pid=child.pid)
    code = _wait(child)
    return CaptureResult(exit_code=code if code >= 0 else 128 - code, runs=assemble(prof, code))


def _wait(child: subprocess.Popen) -> int:
    """Wait for the child; a SIGTERM to the capture is passed on (the child flushes and dies of
    it). Ctrl-C reaches the child from the terminal by itself, so the capture only keeps waiting."""
    if threading.current_thread() is not threading.main_thread():
        return child.wait()
    old = {signal.SIGTERM: signal.signal(signal.SIGTERM, lambda s, f: child.send_signal(s)),
           signal.SIGINT: signal.signal(signal.SIGINT, lambda s, f: None)}
    try:
        return child.wait()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def assemble(prof: str | Path, exit_code: int | None) -> list[Path]:
    """Turn the staging data of a capture into PROF dir(s): raw data, exports, status, README.

    exit_code: the program's (negative: killed by that signal), or None when unknown (the capture
    itself was killed and this runs later, from `--export=on`).
    """
    prof = Path(prof)
    staging = prof / prof_dir.STAGING_DIR
    base = prof_dir.read_status(prof)
    reasons = _exit_reasons(exit_code)
    sessions = sorted((d for d in staging.glob("session-*") if (d / "trace.parquet").is_file()),
                      key=lambda d: tuple(int(x) for x in d.name.split("-")[1:])) if staging.is_dir() else []
    status = {**base, "exit_code": exit_code}
    if not sessions:
        prof_dir.write_status(prof, {**status, "status": prof_dir.INCOMPLETE, "finished": prof_dir.now_iso(),
                                     "reasons": reasons + ["nothing was recorded: the program never called "
                                                           "acl.init() (or died before its first flush)"]})
        prof_dir.write_readme(prof)
        shutil.rmtree(staging, ignore_errors=True)
        return [prof]
    runs = []
    for i, session in enumerate(sessions):
        target = prof if i == 0 else prof_dir.new_prof_dir(prof.parent)
        state = _read_json(session / "state.json")
        # How the program ended concerns the session it ended in: the last one.
        why = list(reasons) if i == len(sessions) - 1 else []
        if not state.get("final"):
            why.append(state.get("reason") or "the program stopped before acl.finalize()")
        trace = read_trace(session / "trace.parquet")
        prof_dir.write_status(target, {**status, "session": i})
        prof_dir.finish(target, trace, status=prof_dir.INCOMPLETE if why else prof_dir.COMPLETE, reasons=why)
        runs.append(target)
    shutil.rmtree(staging, ignore_errors=True)
    return runs


def _exit_reasons(code: int | None) -> list[str]:
    if code is None:
        return ["the capture stopped before the program ended (was msprof-py killed?)"]
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return [f"the program was killed by {name}"]
    return [f"the program exited with code {code}"] if code else []


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def export(output: str | Path) -> list[Path]:
    """`--export=on`: regenerate the exports of a PROF dir (or of every PROF dir in output);
    a capture whose msprof-py was killed is assembled from its staging data first."""
    done = []
    dirs = prof_dir.prof_dirs(output)
    if not dirs:
        raise MsprofError(f"{output}: no PROF_* directories here", hint="--output names a PROF dir or its parent")
    for prof in dirs:
        if (prof / prof_dir.STAGING_DIR).is_dir():
            st = prof_dir.read_status(prof)
            for key in ("program_pid", "capture_pid"):
                if st.get(key) and _alive(st[key]) and st[key] != os.getpid():
                    raise MsprofError(f"{prof.name}: still being captured ({key.split('_')[0]} pid {st[key]} "
                                      f"is running)", hint="export it when the program has ended")
            done += assemble(prof, None)
        else:
            prof_dir.export(prof)
            done.append(prof)
    return done


def _alive(pid: int) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (ended, not yet reaped by its parent) is not running.
    try:
        return Path(f"/proc/{int(pid)}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return True


# ---------------------------------------------------------------------- built-in scenarios
def warn_if_slow(events: int) -> bool:
    """Say once, on stderr, that a run of about `events` trace events will run on the slower
    pure-Python emulator core, and how to get the compiled one; True when it said so."""
    import runtime_emu
    from simcore import _loader

    if runtime_emu.COMPILED or events <= LARGE_RUN_EVENTS:
        return False
    print(f"msprof-py: warning: ~{events:,} trace events on the pure-Python emulator core "
          f"({_loader.pure_reason}), about {_loader.SPEEDUP}x slower than the compiled one; "
          "build it with `pip install -e .` (needs a C compiler and the Python headers)", file=sys.stderr)
    return True


def emulate(scenario: str, output: str | Path, *, problems: Iterable[str] = (), switches: Switches | None = None,
            seed: int = 0, steps: int | None = None, ranks: int | None = None,
            params: dict[str, Any] | None = None, stream: bool = False, exports: bool = True,
            ground_truth: bool = True) -> Path:
    """Run a built-in scenario in-process with `switches` recorded; write its PROF dir (with
    ground_truth.json unless `ground_truth=False`).

    `stream`: the trace goes to disk while the scenario runs (runtime_emu's streaming writer,
    one file per rank) and is then laid out in the PROF dir a row group at a time, so memory
    holds what is still running and one row group, never the whole trace. `exports=False`
    skips mindstudio_profiler_output/ (the timeline and summaries need the whole table;
    `msprof-py --export=on` writes them later)."""
    from runtime_emu import scenarios

    switches = switches or Switches()
    try:
        spec = scenarios.get(scenario)
        cfg = scenarios.configure(spec, list(problems), seed=seed, steps=steps, ranks=ranks, params=params or {})
    except ValueError as exc:
        raise MsprofError(str(exc)) from None
    prof_dir.check_output(output)
    if not ground_truth and cfg.switches:
        raise MsprofError("--ground-truth off cannot be used with --switch: injected problems are described "
                          "from the ground truth", hint="drop the --switch options or keep --ground-truth on")
    size = spec.size(cfg) if spec.size is not None else 0
    warn_if_slow(size)
    prof = prof_dir.new_prof_dir(output)
    streamed = prof / prof_dir.STAGING_DIR / "trace" if stream else None
    if streamed is not None:
        streamed.parent.mkdir()
    known = scenarios.all_params(spec)
    command = " ".join(["emulate", scenario, *(f"--switch {p}" for p in sorted(cfg.switches)),
                        *(f"--param {k}={known[k].text(v)}" for k, v in sorted((params or {}).items())),
                        f"--seed {seed}", f"--steps {cfg.steps}", f"--ranks {cfg.ranks}",
                        *(["--stream"] if stream else []), *([] if exports else ["--export off"]),
                        *([] if ground_truth else ["--ground-truth off"])])
    # A progress bar on a terminal for a large run: rank 0's steps, then (streamed) each rank's layout.
    with progress_reporter(0, force=size > LARGE_RUN_EVENTS and sys.stderr.isatty()) as update:
        def step_done(rank: int, n: int) -> None:
            if rank == 0:
                update("steps", n + 1, cfg.steps)

        try:
            result = scenarios.run_configured(spec, cfg, record=switches, trace_path=streamed,
                                              ground_truth=ground_truth, on_step_end=step_done)
        except BaseException:
            shutil.rmtree(prof / prof_dir.STAGING_DIR, ignore_errors=True)
            raise
        prof_dir.write_status(prof, {"source": "emulate", "command": command, "switches": asdict(switches),
                                     "started": prof_dir.now_iso(), "msprof_py": __version__, "exit_code": 0})
        truth = result.ground_truth if ground_truth else None
        if streamed is None:
            return prof_dir.finish(prof, result.trace, ground_truth=truth, exports=exports,
                                   status=prof_dir.COMPLETE, reasons=[])
        assert result.trace_path == streamed, "a streamed run leaves its trace where it was streamed"
        prof_dir.finish_streamed(prof, streamed, ground_truth=truth, exports=exports, status=prof_dir.COMPLETE,
                                 reasons=[], progress=lambda done, total: update("layout", done, total))
        shutil.rmtree(prof / prof_dir.STAGING_DIR, ignore_errors=True)
        return prof
