"""Run cases in isolated worker processes: a crash or a hang is one case's result.

Each of ``jobs`` threads owns a persistent worker (``python -m harness.random_cases.worker``)
and feeds it cases one at a time from a shared queue. The parent enforces the per-case timeout
(the worker's whole process group is killed: *hang*) and notices a worker that died (*crash*,
with the signal or exit status and the tail of its stderr); a fresh worker takes the next case.
Results are written as JSON lines in case-index order as soon as every earlier case is done.
"""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional, Sequence

from harness.random_cases.case import CRASH, ERROR, HANG, Case, Result

DEFAULT_TIMEOUT_S = 120.0
STARTUP_TIMEOUT_S = 300.0  # imports (TVM, tvm_roller) on a busy machine
STDERR_KEEP = 4000  # characters of a crashed case's stderr kept in its result
# faulthandler's innermost Python frame: '  File "/x/y.py", line 28 in before_step'
_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
Progress = Callable[[Result, int, int], None]  # (result, done, total)


class WorkerStartError(RuntimeError):
    """A worker could not start (the environment is broken, not a case): the run stops."""


def _harness_parent() -> str:
    """The folder that holds the ``harness`` package (``python/``)."""
    return str(Path(__file__).resolve().parents[2])


def worker_env(jobs: int) -> Dict[str, str]:
    """The workers' environment: the harness importable, and the CPU's cores shared out
    between the workers (unless the caller set TVM_NUM_THREADS)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_harness_parent(), env.get("PYTHONPATH"))
                                        if p)
    if "TVM_NUM_THREADS" not in env:
        cores = len(os.sched_getaffinity(0))
        env["TVM_NUM_THREADS"] = str(max(1, cores // max(1, jobs)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker killed by {name}"
    return f"worker exited with status {code}"


def _where(stderr: str) -> str:
    """``, at file.py:28 in func``: the innermost Python frame faulthandler printed."""
    m = _FRAME.search(stderr.partition("Current thread")[2])
    return f", at {os.path.basename(m.group(1))}:{m.group(2)} in {m.group(3)}" if m else ""


class Worker:
    """One worker process, its stdout read line by line on a thread into a queue (None at end
    of file), its stderr in a temporary file."""

    def __init__(self, env: Dict[str, str], startup_timeout: float = STARTUP_TIMEOUT_S):
        self.stderr: IO[bytes] = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.random_cases.worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.stderr, env=env, text=True, encoding="utf-8",
            start_new_session=True)  # its own process group: a kill reaches nvcc too
        self.lines: "queue.Queue[Optional[str]]" = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            first = self._next(startup_timeout)
        except queue.Empty:
            first = None
        if first is None or not first.get("ready"):
            why = "no answer" if first is None else f"unexpected {first}"
            self.kill()
            raise WorkerStartError(f"worker did not start ({why}): {self.stderr_tail()}")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _next(self, timeout: float) -> Optional[dict]:
        """The next JSON message; None at end of file; ``queue.Empty`` after ``timeout``."""
        line = self.lines.get(timeout=max(0.0, timeout))
        return None if line is None else json.loads(line)

    def stderr_size(self) -> int:
        return os.fstat(self.stderr.fileno()).st_size

    def stderr_since(self, start: int, limit: int = STDERR_KEEP) -> str:
        """What the worker wrote to stderr since offset ``start`` (its head: on a crash,
        faulthandler's Python stack comes first, the native backtrace after it)."""
        # pread: the worker shares this file's offset, which a seek here would move
        return os.pread(self.stderr.fileno(), limit, start).decode("utf-8", "replace").strip()

    def stderr_tail(self) -> str:
        return self.stderr_since(max(0, self.stderr_size() - STDERR_KEEP))

    def run(self, case: Case, timeout: float) -> Result:
        """``case`` checked by this worker; a crash or a timeout ends the worker (``alive``)."""
        t0 = time.perf_counter()
        step = "send"
        err_start = self.stderr_size()
        try:
            self.proc.stdin.write(case.to_json() + "\n")
            self.proc.stdin.flush()
            while True:
                msg = self._next(timeout - (time.perf_counter() - t0))
                if msg is None:
                    break
                if "step" in msg:
                    step = str(msg["step"])
                    continue
                return Result.from_dict(msg)
        except queue.Empty:
            self.kill()
            return Result(case, HANG, f"no result within {timeout:g} s (in step {step}); "
                          "worker killed", step, seconds=round(time.perf_counter() - t0, 3))
        except BrokenPipeError:
            pass  # died before reading the case: reported as a crash below
        except (ValueError, KeyError) as err:  # a line that is not a result: end this worker
            self.kill()
            return Result(case, ERROR, f"worker sent an unreadable line ({err})", "protocol",
                          seconds=round(time.perf_counter() - t0, 3))
        code = self.proc.wait()
        err = self.stderr_since(err_start)
        return Result(case, CRASH, f"{_exit_reason(code)} (in step {step}{_where(err)})", step,
                      seconds=round(time.perf_counter() - t0, 3), facts={"stderr": err})

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL to the worker's process group (it and any nvcc it started), then reap."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone
        self.proc.wait()

    def close(self) -> None:
        if self.alive:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.stderr.close()


class _Ordered:
    """Results in case order: each is written out once every case before it is done."""

    def __init__(self, cases: Sequence[Case], sink: Optional[IO[str]],
                 progress: Optional[Progress]):
        self.order = [c.index for c in cases]
        self.results: Dict[int, Result] = {}
        self.sink, self.progress = sink, progress
        self.next = 0
        self.lock = threading.Lock()

    def add(self, result: Result) -> None:
        with self.lock:
            self.results[result.case.index] = result
            if self.progress is not None:
                self.progress(result, len(self.results), len(self.order))
            while self.next < len(self.order) and self.order[self.next] in self.results:
                if self.sink is not None:
                    self.sink.write(self.results[self.order[self.next]].to_json() + "\n")
                    self.sink.flush()
                self.next += 1


def run_cases(cases: Sequence[Case], out: Optional[str] = None,
              timeout: float = DEFAULT_TIMEOUT_S, jobs: int = 1,
              progress: Optional[Progress] = None,
              startup_timeout: float = STARTUP_TIMEOUT_S) -> List[Result]:
    """Check every case in isolated workers; results in case order (also as JSON lines in
    ``out`` when given). Raises :class:`WorkerStartError` if a worker cannot start at all."""
    if len({c.index for c in cases}) != len(cases):
        raise ValueError("case indices must be unique")
    todo: "queue.Queue[Case]" = queue.Queue()
    for c in cases:
        todo.put(c)
    env = worker_env(jobs)
    failures: List[BaseException] = []  # what stopped a driver thread, raised here after
    live: Dict[int, Worker] = {}  # thread slot -> its worker, killed if the run is interrupted

    def drive(slot: int, collect: _Ordered) -> None:
        try:
            while not failures:
                try:
                    case = todo.get_nowait()
                except queue.Empty:
                    return
                worker = live.get(slot)
                if worker is None or not worker.alive:
                    if worker is not None:
                        worker.close()
                    live[slot] = worker = Worker(env, startup_timeout)
                collect.add(worker.run(case, timeout))
        except Exception as err:  # re-raised by run_cases in the calling thread
            failures.append(err)
        finally:
            worker = live.pop(slot, None)
            if worker is not None:
                worker.close()

    sink = open(out, "w", encoding="utf-8") if out else None
    try:
        collect = _Ordered(cases, sink, progress)
        threads = [threading.Thread(target=drive, args=(slot, collect), daemon=True)
                   for slot in range(max(1, min(jobs, len(cases))))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for worker in list(live.values()):  # only after an interrupt: drivers close their own
            worker.kill()
        if sink is not None:
            sink.close()
    if failures:
        raise failures[0]
    return [collect.results[c.index] for c in cases]
