"""Attack suite: each attack through the public API, then the host is checked and the next run must work."""
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from executor import run_program, run_tests, Test
from executor.batch import run_program_batch
from executor.sandbox import UID_BASE, UID_COUNT, isolation_mode

# each test asserts that no sandbox process is left on the host: any test's sandbox beside it would fail that
pytestmark = pytest.mark.serial

REPO = Path(__file__).resolve().parents[1]
needs_bwrap = pytest.mark.skipif(isolation_mode() != "bwrap", reason="bubblewrap not installed: "
                                 "filesystem/network isolation is only promised with bwrap")


def _sandbox_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "uid=,pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()
            if line.split() and UID_BASE <= int(line.split()[0]) < UID_BASE + UID_COUNT or "rljax-run-" in line]


def _host_is_clean() -> None:
    deadline = time.time() + 3  # a just-killed tree may take a moment to be reaped
    while _sandbox_processes() and time.time() < deadline:
        time.sleep(0.05)
    assert _sandbox_processes() == []
    assert run_program("print(6 * 7)", time_limit_s=5).stdout == "42\n"  # the next run works


def run(source, stdin="", **kw):
    kw.setdefault("time_limit_s", 2)
    kw.setdefault("memory_limit_mb", 512)
    result = run_program(source, stdin, **kw)
    batch = run_program_batch(source, [stdin], **kw)[0]  # the same attack inside the batch harness
    _host_is_clean()
    return result, batch


@pytest.mark.parametrize("name,source,status", [
    ("fork_bomb", "import os\nwhile True:\n    os.fork()", "runtime_error"),
    ("memory_bomb", "x = []\nwhile True:\n    x.append(' ' * 10**7)", "memory_limit"),
    ("infinite_loop", "while True:\n    pass", "timeout"),
    ("sleep_forever", "import time\ntime.sleep(10**6)", "timeout"),
    ("ignores_sigterm", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(1)",
     "timeout"),
    ("huge_stdout", "import sys\nsys.stdout.write('x' * 100_000_000)", "output_limit"),
    ("deep_recursion", "def f(n):\n    return f(n + 1)\nf(0)", "runtime_error"),
    ("exception", "raise ValueError('boom')", "runtime_error"),
])
def test_attack_gets_right_status_and_leaves_nothing(name, source, status):
    # Faulting in 512 MiB took 2.4 s of CPU on a CI host (0.3 s here): the bomb gets a smaller limit and the
    # time to reach it.
    kw = {"time_limit_s": 10, "memory_limit_mb": 256} if status == "memory_limit" else {}
    for result in run(source, **kw):
        assert result.status == status, (name, result)


def test_setsid_double_fork_daemon_does_not_outlive_the_run(tmp_path):
    marker = tmp_path / "alive"
    source = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
              f"        time.sleep(1.5)\n        open({str(marker)!r}, 'w').write('x')\n    os._exit(0)\nprint('done')")
    single, batch = run(source)
    assert single.stdout == "done\n" and batch.stdout == "done\n"
    time.sleep(2)
    assert not marker.exists()
    assert _sandbox_processes() == []


def test_killing_the_parent_does_not_hurt_the_host():
    single, batch = run("import os\nos.kill(os.getppid(), 9)\nos.kill(1, 9)\nprint('still here')")
    assert single.status in ("ok", "runtime_error") and batch.status in ("ok", "runtime_error")


def test_reading_stdin_when_none_is_given_sees_eof():
    single, batch = run("import sys\nprint(len(sys.stdin.read()))")
    assert single.stdout == "0\n" and batch.stdout == "0\n"


def test_exit_zero_before_printing_fails_the_test():
    results = run_tests("import sys\nsys.exit(0)\nprint(3)", [Test("1 2\n", "3\n")])
    assert not results[0].passed and results[0].status == "wrong_answer"


@needs_bwrap
def test_environment_and_home_are_not_visible():
    os.environ["RLJAX_SECRET_FOR_TEST"] = "hunter2"
    try:
        single, batch = run("import os\nprint(dict(os.environ))\nprint(os.listdir('/root') if os.path.exists('/root') "
                            "else 'no home')\nprint(open('/proc/1/environ').read() if os.path.exists('/proc/1/environ')"
                            " else '')")
    finally:
        del os.environ["RLJAX_SECRET_FOR_TEST"]
    for result in (single, batch):
        assert "hunter2" not in result.stdout and "RLJAX_SECRET" not in result.stdout
        assert str(REPO) not in result.stdout


@needs_bwrap
def test_files_outside_scratch_cannot_be_written_or_deleted(tmp_path):
    victim = REPO / "setup.py"
    before = victim.read_bytes()
    outside = tmp_path / "planted"
    source = (f"import os\nfor path in [{str(victim)!r}, {str(outside)!r}, '/tmp/../etc/planted', '/usr/planted']:\n"
              "    try:\n        open(path, 'w').write('pwned')\n        print('wrote', path)\n"
              "    except OSError as e:\n        print('blocked', type(e).__name__)\n"
              f"try:\n    os.remove({str(victim)!r})\n    print('deleted')\nexcept OSError:\n    print('blocked')\n"
              "open('scratch.txt', 'w').write('fine')\nprint(open('scratch.txt').read())")
    single, batch = run(source)
    for result in (single, batch):
        assert "wrote" not in result.stdout and "deleted" not in result.stdout
        assert result.stdout.rstrip().endswith("fine")
    assert victim.read_bytes() == before and not outside.exists() and not Path("/usr/planted").exists()


@needs_bwrap
def test_no_network_even_to_a_localhost_listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    accepted = []
    server.settimeout(3)
    thread = threading.Thread(target=lambda: accepted.append(_accept(server)))
    thread.start()
    single, batch = run(f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))\n"
                        "print('connected')")
    thread.join()
    server.close()
    assert accepted == [None]
    for result in (single, batch):
        assert result.status == "runtime_error" and "connected" not in result.stdout


def _accept(server):
    try:
        return server.accept()
    except OSError:
        return None


def test_rlimits_fallback_is_reported_and_still_kills(monkeypatch):
    monkeypatch.setenv("RLJAX_SANDBOX", "rlimits")
    result = run_program("print('hi')", time_limit_s=2)
    assert result.status == "ok" and result.isolation == "rlimits"
    assert run_program("while True: pass", time_limit_s=1).status == "timeout"
    assert run_program("x = ' ' * 2**32", memory_limit_mb=256).status == "memory_limit"
    monkeypatch.delenv("RLJAX_SANDBOX")
    _host_is_clean()


def test_large_stdin_arrives_whole_in_both_runners():
    text = "".join(f"{i}\n" for i in range(60_000))  # ~350 KB, several pipe buffers
    source = "import sys\ndata = sys.stdin.read()\nprint(len(data), data.count('\\n'))"
    single, batch = run(source, text, time_limit_s=5)
    assert single.stdout == batch.stdout == f"{len(text)} 60000\n"


@pytest.mark.parametrize("use_prlimit", [True, False])
def test_limits_are_set_by_an_execed_helper_not_in_the_forked_child(use_prlimit):
    """Both helpers (util-linux prlimit and the Python launcher) set every limit and then exec the command."""
    import shutil
    import sys

    from executor.sandbox import limits_prefix

    if use_prlimit and shutil.which("prlimit") is None:
        pytest.skip("util-linux prlimit is not installed")
    probe = "import os, resource; print(os.getpid(), resource.getrlimit(resource.RLIMIT_NOFILE), " \
            "resource.getrlimit(resource.RLIMIT_CPU))"
    cmd = limits_prefix([("nofile", 100, 100), ("cpu", 7, 8)], use_prlimit) + [sys.executable, "-c", probe]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    pid, limits = out.split(" ", 1)
    assert int(pid) == proc.pid  # exec'd in place: the run's pid, rusage and process group stay the command's
    assert limits.strip() == "(100, 100) (7, 8)"


@pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids are handed out only when the host runs as root")
def test_two_processes_on_one_host_never_run_programs_as_the_same_uid():
    """The uid pool is held through flocks shared by every process on the host; a holder that exits (here
    without releasing) frees its uids."""
    import sys

    from executor.sandbox import _UIDS

    held = [_UIDS.acquire() for _ in range(3)]
    try:
        code = "from executor.sandbox import _UIDS; print(*[_UIDS.acquire() for _ in range(3)])"
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        theirs = [int(uid) for uid in out.stdout.split()]
        assert len(set(theirs)) == 3 and not set(theirs) & set(held), (held, theirs)
    finally:
        for uid in held:
            _UIDS.release(uid)
    again = [_UIDS.acquire() for _ in range(6)]
    for uid in again:
        _UIDS.release(uid)
    assert set(theirs) <= set(again)


def test_uid_lock_folder_that_others_can_write_is_refused(tmp_path):
    from executor.sandbox import _UidPool

    folder = tmp_path / "uids"
    folder.mkdir()
    folder.chmod(0o777)
    with pytest.raises(RuntimeError, match=f"sandbox uid locks: {folder} must be a directory owned by uid"):
        _UidPool(UID_BASE, 4, folder).acquire()
