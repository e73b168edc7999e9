"""Many stdin runs of one program in one sandbox: a trusted harness forks a fresh child per input.

Starting bwrap and an interpreter costs ~10 ms; forking a warm harness ~1 ms. The harness (PID 1 of the
sandbox's PID namespace, no /proc mounted, marked non-dumpable so the children cannot ptrace it or read its
memory) reads all inputs first, then per input: forks a child with its own pipes, its own CPU limit and no
other file descriptors; relays the child's stdout/stderr, exit status and CPU time as one length-prefixed marshal record; and
kills every process left in the namespace before the next input. The host parent still makes the verdict,
from the relayed stdout. Used only with bwrap isolation (the fallback runs each input on its own).
"""
from __future__ import annotations

import marshal
import struct
from typing import Sequence

from executor.sandbox import RunResult, classify, isolation_mode, run_program, sandboxed_python

HARNESS = r'''
import ctypes, marshal, os, resource, select, signal, struct, sys, time
if os.getpid() != 1:  # it SIGKILLs every other process it can see: only ever as PID 1 of its own namespace
    sys.exit("harness: refusing to run outside a fresh PID namespace")
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0: children cannot ptrace or inspect the harness
inputs, limit, out_limit = marshal.loads(sys.stdin.buffer.read())
source = open("main.py").read()
report = os.dup(1)
for data in inputs:
    fds = [os.pipe() for _ in range(3)]
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        for target, (r, w) in zip((0, 1, 2), fds):
            os.dup2(r if target == 0 else w, target)
        os.closerange(3, 4096)
        cpu = int(limit) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        code = 0
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", closefd=False)
        sys.stderr = open(2, "w", closefd=False)
        namespace = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
        try:
            exec(compile(source, "main.py", "exec"), namespace)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if stop.code is not None and not isinstance(stop.code, int):
                print(stop.code, file=sys.stderr)
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            code = code or 120
        os._exit(code)
    os.close(fds[0][0]); os.close(fds[1][1]); os.close(fds[2][1])
    writer, pending = fds[0][1], data
    os.set_blocking(writer, False)
    if not pending:
        os.close(writer); writer = None
    bufs = {fds[1][0]: bytearray(), fds[2][0]: bytearray()}
    out_buf, err_buf = bufs[fds[1][0]], bufs[fds[2][0]]
    deadline = start + limit + 0.5
    timed_out = over = False
    status = None
    while bufs and not over:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = status is None
            break
        wlist = [writer] if writer is not None else []
        readable, writable, _ = select.select(list(bufs), wlist, [], min(left, 0.05))
        if writable:
            try:
                n = os.write(writer, pending[:65536]); pending = pending[n:]
            except BlockingIOError:
                pass
            except OSError:  # the child closed stdin or exited
                pending = b""
            if not pending:
                os.close(writer); writer = None
        for fd in readable:
            chunk = os.read(fd, 65536)
            if not chunk:
                os.close(fd); del bufs[fd]; continue
            bufs[fd] += chunk
            if len(bufs[fd]) > out_limit:
                over = True
        if status is None:
            done, word, usage = os.wait4(pid, os.WNOHANG)
            if done:
                status = (word, usage)
                deadline = min(deadline, time.monotonic() + 0.2)
    out, err = bytes(out_buf), bytes(err_buf)
    try:
        os.kill(-1, signal.SIGKILL)  # PID 1: everything else in the namespace, stray daemons included
    except OSError:
        pass
    if status is None:
        _, word, usage = os.wait4(pid, 0)
        status = (word, usage)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    for fd in list(bufs) + ([writer] if writer is not None else []):
        os.close(fd)
    word, usage = status
    exit_code = -os.WTERMSIG(word) if os.WIFSIGNALED(word) else os.WEXITSTATUS(word)
    record = marshal.dumps((exit_code, usage.ru_utime + usage.ru_stime, time.monotonic() - start, timed_out,
                            over, out[:out_limit], err[:out_limit]))
    os.write(report, struct.pack("<I", len(record)) + record)
'''


def run_program_batch(source: str, inputs: Sequence[str], *, time_limit_s: float = 10.0,
                      memory_limit_mb: int = 1024, output_limit_bytes: int = 1 << 20) -> list[RunResult]:
    """One RunResult per input, as `run_program` would give, with one sandbox for all of them."""
    if isolation_mode() != "bwrap" or not inputs:
        return [run_program(source, text, time_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb,
                            output_limit_bytes=output_limit_bytes) for text in inputs]
    job = marshal.dumps(([text.encode() for text in inputs], float(time_limit_s), int(output_limit_bytes)))
    n = len(inputs)
    raw = sandboxed_python({"main.py": source, "harness.py": HARNESS}, "harness.py", job,
                           wall_limit_s=n * (time_limit_s + 1.0) + 2.0, cpu_limit_s=n * (time_limit_s + 1.0) + 2,
                           memory_limit_mb=memory_limit_mb, output_limit_bytes=3 * n * output_limit_bytes + 65536,
                           mount_proc=False)
    results: list[RunResult] = []
    stream, pos = raw.stdout, 0
    while pos + 4 <= len(stream) and len(results) < n:
        (size,) = struct.unpack_from("<I", stream, pos)
        if pos + 4 + size > len(stream):
            break
        exit_code, cpu, wall, timed_out, over, out, err = marshal.loads(stream[pos + 4:pos + 4 + size])
        pos += 4 + size
        results.append(classify(exit_code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), wall,
                                cpu, timed_out, over, time_limit_s, raw.isolation))
    if len(results) < n:  # the harness itself failed: every input it did not report is a sandbox error
        note = "sandbox: harness ended early: " + raw.stderr.decode("utf-8", "replace")[-500:]
        results += [RunResult("sandbox_error", "", note, None, raw.wall_s, 0.0, raw.isolation)
                    for _ in range(n - len(results))]
    return results
