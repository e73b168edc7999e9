"""Run untrusted Python programs: bubblewrap namespaces + rlimits + an unprivileged uid, whole tree killed.

Each run gets a private scratch dir (the only writable path), an empty environment, no network, its own PID
namespace (so ending bwrap ends every process of the run), read-only system dirs and nothing of the repo or
home. When the host process is root the run drops to a uid of its own (rlimits on process count do not bind
root, and a unique uid lets the fallback kill every process the run left). Without bwrap the run falls back
to rlimits + its own session + uid-wide kill, and says so: `isolation="rlimits"` in every result and one
warning in the log. The verdict is made here from exit status and output, never from files the program writes.
"""
from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

log = logging.getLogger("executor.sandbox")
# JAX warns at every fork of a multithreaded process. Our children run no Python between fork and exec (session,
# uid and groups are set by subprocess in C; rlimits by an exec'd helper), so no lock of another thread is taken.
warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)

STATUSES = ("ok", "runtime_error", "timeout", "memory_limit", "output_limit", "sandbox_error")
SANDBOX_DIR = "/sandbox"
UID_BASE, UID_COUNT = 61000, 512
MAX_PROCESSES = 64


@dataclasses.dataclass
class RunResult:
    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    wall_s: float
    cpu_s: float
    isolation: str  # "bwrap" or "rlimits"


class _UidPool:
    """Unprivileged uids handed out one per concurrent run (only used when the host process is root), unique on
    the host: a uid is held through an exclusive `flock` on `lock_dir/<uid>`, which the kernel drops if its
    holder dies. Two rljax processes on one machine (two runs, the local processes of a multi-process run) thus
    never run programs as the same uid at once, where the rlimits fallback's uid-wide kill and the per-uid
    process limit would reach into the other's run."""

    def __init__(self, base: int, count: int, lock_dir: Path):
        self._uids = range(base, base + count)
        self._lock_dir = lock_dir
        self._held: dict[int, int] = {}  # uid -> the descriptor whose flock holds it
        self._cond = threading.Condition()

    def acquire(self) -> int:
        with self._cond:
            _private_dir(self._lock_dir)
            while True:
                for uid in self._uids:
                    if uid not in self._held and self._lock(uid):
                        return uid
                self._cond.wait(0.05)  # all taken here or by other processes: one of them frees a uid

    def _lock(self, uid: int) -> bool:
        """Take `uid` if no process (this one included) holds its flock."""
        fd = os.open(self._lock_dir / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process runs a program as this uid
            os.close(fd)
            return False
        self._held[uid] = fd
        return True

    def release(self, uid: int) -> None:
        with self._cond:
            os.close(self._held.pop(uid))  # closing the only descriptor drops the lock
            self._cond.notify()


def _private_dir(path: Path) -> None:
    """Create `path` as this user's, mode 0700, or check that it already is (its lock files decide uids)."""
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not path.is_dir() or path.is_symlink() or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise RuntimeError(f"sandbox uid locks: {path} must be a directory owned by uid {os.geteuid()} with mode "
                           f"0700 (found uid {info.st_uid}, mode {oct(info.st_mode & 0o777)})")


_UIDS = _UidPool(UID_BASE, UID_COUNT, Path(tempfile.gettempdir()) / "rljax-sandbox-uids")
_warned = False


def isolation_mode() -> str:
    """'bwrap' when bubblewrap is installed, else 'rlimits' (warned about once). RLJAX_SANDBOX=rlimits forces
    the fallback (for testing it), still with the warning."""
    global _warned
    forced = os.environ.get("RLJAX_SANDBOX", "")
    if forced not in ("", "bwrap", "rlimits"):
        raise ValueError(f"RLJAX_SANDBOX={forced!r}: expected 'bwrap' or 'rlimits'")
    mode = "bwrap" if shutil.which("bwrap") and forced != "rlimits" else "rlimits"
    if mode == "rlimits" and not _warned:
        _warned = True
        log.warning("executor: bubblewrap (bwrap) not found; untrusted code runs with rlimits + session kill only "
                    "(isolation=rlimits): no filesystem, network or PID isolation. Install the 'bubblewrap' package.")
        print("WARNING executor: bwrap missing, sandbox isolation=rlimits (weaker)", file=sys.stderr)
    return mode


def interpreter() -> str:
    return "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def _bwrap_command(scratch: str, python: str, script: str, mount_proc: bool = True) -> list[str]:
    cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--as-pid-1", "--clearenv",
           "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", SANDBOX_DIR, "--setenv", "PYTHONHASHSEED", "0",
           "--ro-bind", "/usr", "/usr", "--dev", "/dev", "--tmpfs", "/tmp"]
    if mount_proc:
        cmd += ["--proc", "/proc"]
    for top in ("/bin", "/lib", "/lib64", "/lib32", "/sbin"):
        if os.path.islink(top):
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    prefix = os.path.realpath(sys.base_prefix)
    if not python.startswith("/usr/") and not prefix.startswith("/usr"):
        cmd += ["--ro-bind", prefix, prefix]  # the interpreter's own install, read-only (not the rest of home)
    cmd += ["--bind", scratch, SANDBOX_DIR, "--chdir", SANDBOX_DIR, "--", python, "-I", "-S", script]
    return cmd


def _rlimits(uid: int | None, time_limit_s: float, memory_limit_mb: int, file_limit_bytes: int
             ) -> list[tuple[str, int, int]]:
    """(name, soft, hard) of each rlimit a run gets; a process-count limit only binds a non-root uid."""
    mem, cpu = memory_limit_mb * 2**20, int(time_limit_s) + 1
    limits = [("as", mem, mem), ("cpu", cpu, cpu + 1), ("fsize", file_limit_bytes, file_limit_bytes),
              ("core", 0, 0), ("nofile", 256, 256)]
    if uid is not None:
        limits.append(("nproc", MAX_PROCESSES, MAX_PROCESSES))
    return limits


# Sets the rlimits named before "--", then execs what follows: the fallback where util-linux prlimit is missing.
_SETRLIMIT_EXEC = ("import os, resource, sys\n"
                   "cut = sys.argv.index('--')\n"
                   "for spec in sys.argv[1:cut]:\n"
                   "    name, soft, hard = spec.split(':')\n"
                   "    resource.setrlimit(getattr(resource, 'RLIMIT_' + name.upper()), (int(soft), int(hard)))\n"
                   "os.execvp(sys.argv[cut + 1], sys.argv[cut + 1:])\n")


def limits_prefix(limits: list[tuple[str, int, int]], use_prlimit: bool | None = None) -> list[str]:
    """A command prefix that applies `limits` to itself and then execs the command after it.

    The limits are set by an exec'd helper (util-linux `prlimit`, or a small Python launcher) rather than in a
    `preexec_fn`: Python code between fork and exec can deadlock in a multithreaded host such as JAX's.
    """
    if use_prlimit is None:
        use_prlimit = shutil.which("prlimit") is not None
    if use_prlimit:
        return ["prlimit"] + [f"--{name}={soft}:{hard}" for name, soft, hard in limits] + ["--"]
    return [interpreter(), "-I", "-S", "-c", _SETRLIMIT_EXEC] + [f"{n}:{s}:{h}" for n, s, h in limits] + ["--"]


def _as_uid(uid: int | None) -> dict[str, object]:
    """Popen arguments that start the child as `uid` (done by subprocess in C, between fork and exec)."""
    return {} if uid is None else {"user": uid, "group": uid, "extra_groups": []}


def _kill_uid(uid: int) -> None:
    """SIGKILL every process owned by `uid` (a helper started as that uid signals -1, itself included)."""
    subprocess.run([interpreter(), "-I", "-S", "-c", "import os, signal; os.kill(-1, signal.SIGKILL)"],
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={},
                   cwd="/", **_as_uid(uid))


def _status(exit_code: int, stderr: str, timed_out: bool, over_output: bool, cpu_s: float, time_limit_s: float,
            isolation: str) -> str:
    if over_output:
        return "output_limit"
    if timed_out or exit_code in (-signal.SIGXCPU, 128 + signal.SIGXCPU) or cpu_s > time_limit_s:
        return "timeout"
    tail = stderr.strip().splitlines()[-1:] if stderr.strip() else []
    if tail and (tail[0].startswith("MemoryError") or tail[0].endswith("MemoryError")):
        return "memory_limit"
    if exit_code == 0:
        return "ok"
    if isolation == "bwrap" and exit_code == 1 and stderr.startswith("bwrap:"):
        return "sandbox_error"
    return "runtime_error"


@dataclasses.dataclass
class _RawRun:
    stdout: bytes
    stderr: bytes
    exit_code: int | None
    wall_s: float
    cpu_s: float
    timed_out: bool
    over_output: bool
    isolation: str


def sandboxed_python(files: dict[str, str], script: str, stdin: bytes, *, wall_limit_s: float,
                     cpu_limit_s: float, memory_limit_mb: int, output_limit_bytes: int, mount_proc: bool = True
                     ) -> _RawRun:
    """Write `files` into a fresh scratch dir and run `python -I -S script` there, isolated and limited."""
    isolation = isolation_mode()
    uid = _UIDS.acquire() if os.geteuid() == 0 else None
    scratch = tempfile.mkdtemp(prefix="rljax-run-")
    start = time.monotonic()
    try:
        for name, text in files.items():
            Path(scratch, name).write_text(text)
        if uid is not None:
            os.chown(scratch, uid, uid)
        python = interpreter()
        if isolation == "bwrap":
            cmd, cwd = _bwrap_command(scratch, python, script, mount_proc), None
        else:
            cmd, cwd = [python, "-I", "-S", os.path.join(scratch, script)], scratch
        try:
            cmd = limits_prefix(_rlimits(uid, cpu_limit_s, memory_limit_mb, output_limit_bytes)) + cmd
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env={} if isolation == "bwrap" else {"PATH": "/usr/bin:/bin", "HOME": scratch},
                                    cwd=cwd, close_fds=True, start_new_session=True, **_as_uid(uid))
        except OSError as error:
            return _RawRun(b"", f"sandbox: {error}".encode(), None, time.monotonic() - start, 0.0, False, False,
                           isolation)
        out, err, timed_out, over, exited = _communicate(proc, stdin, start + wall_limit_s, output_limit_bytes)
        _kill_group(proc)
        _, status_word, usage = exited or os.wait4(proc.pid, 0)
        proc.returncode = _decode_exit(status_word)
        return _RawRun(out, err, proc.returncode, time.monotonic() - start, usage.ru_utime + usage.ru_stime,
                       timed_out, over, isolation)
    finally:
        if uid is not None:
            if isolation == "rlimits":  # bwrap's PID namespace already took every process of the run with it
                _kill_uid(uid)  # anything that escaped the process group (setsid daemons)
            _UIDS.release(uid)
        shutil.rmtree(scratch, ignore_errors=True)


def classify(exit_code: int | None, stdout: str, stderr: str, wall_s: float, cpu_s: float, timed_out: bool,
             over_output: bool, time_limit_s: float, isolation: str) -> RunResult:
    if exit_code is None:
        return RunResult("sandbox_error", stdout, stderr, None, wall_s, cpu_s, isolation)
    status = _status(exit_code, stderr, timed_out, over_output, cpu_s, time_limit_s, isolation)
    return RunResult(status, stdout, stderr, exit_code, wall_s, cpu_s, isolation)


def run_program(source: str, stdin: str = "", *, time_limit_s: float = 10.0, memory_limit_mb: int = 1024,
                output_limit_bytes: int = 1 << 20) -> RunResult:
    """Run Python `source` on `stdin` in the sandbox and classify the outcome (see STATUSES)."""
    raw = sandboxed_python({"main.py": source}, "main.py", stdin.encode(), wall_limit_s=time_limit_s + 0.5,
                           cpu_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb,
                           output_limit_bytes=output_limit_bytes)
    return classify(raw.exit_code, raw.stdout.decode("utf-8", "replace"), raw.stderr.decode("utf-8", "replace"),
                    raw.wall_s, raw.cpu_s, raw.timed_out, raw.over_output, time_limit_s, raw.isolation)


def _decode_exit(status_word: int) -> int:
    if os.WIFSIGNALED(status_word):
        return -os.WTERMSIG(status_word)
    return os.WEXITSTATUS(status_word)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _communicate(proc: subprocess.Popen, data: bytes, deadline: float, limit: int
                 ) -> tuple[bytes, bytes, bool, bool, tuple | None]:
    """Feed stdin and collect stdout/stderr until the program exits (then drain briefly), the deadline, or more
    than `limit` bytes of output. Returns (stdout, stderr, timed_out, over_limit, wait4 result or None)."""
    sel = selectors.DefaultSelector()
    buffers = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    for stream in buffers:
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ)
    pending = memoryview(data)
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    timed_out = over = False
    exited = None
    open_streams = 2
    while open_streams:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            timed_out = exited is None
            break
        for key, _ in sel.select(timeout=min(remaining, 0.05)):
            stream = key.fileobj
            if stream is proc.stdin:
                try:
                    written = os.write(stream.fileno(), pending[:65536])
                    pending = pending[written:]
                except BlockingIOError:
                    continue
                except OSError:  # the program closed stdin or exited
                    pending = pending[:0]
                if not pending:
                    sel.unregister(stream)
                    stream.close()
                continue
            chunk = os.read(stream.fileno(), 65536)
            if not chunk:
                sel.unregister(stream)
                open_streams -= 1
                continue
            buffers[stream] += chunk
            if len(buffers[stream]) > limit:
                over = True
                open_streams = 0
                break
        if exited is None:
            pid, status_word, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                exited = (pid, status_word, usage)
                deadline = min(deadline, time.monotonic() + 0.2)  # a leftover child may hold the pipes open
    sel.close()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if not stream.closed:
            stream.close()
    return bytes(buffers[proc.stdout][:limit]), bytes(buffers[proc.stderr][:limit]), timed_out, over, exited
