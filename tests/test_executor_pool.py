"""The worker pool: order, one result per job, timeouts, crashes, a sandbox process killed mid-run."""
import os
import signal
import subprocess
import threading
import time

from executor import ExecutorPool, Limits, Test, run_program, run_tests


def _job(i):
    kind = i % 5
    if kind == 0:
        return i
    if kind == 1:
        raise RuntimeError(f"job {i} crashed")
    if kind == 2:
        time.sleep(0.0005)
        return -i
    if kind == 3:
        return str(i)
    time.sleep(2.0 if i % 2000 == 4 else 0)  # a few exceed the per-job timeout
    return i


def test_ten_thousand_mixed_jobs_each_return_exactly_one_result_in_order():
    with ExecutorPool(workers=8, max_pending=64, job_timeout_s=1.0) as pool:
        outcomes = pool.run_many(_job, range(10_000))
    assert len(outcomes) == 10_000
    for i, out in enumerate(outcomes):
        if i % 5 == 1:
            assert not out.ok and f"job {i} crashed" in out.error
        elif i % 5 == 4 and i % 2000 == 4:
            assert out.error.startswith("timeout")
        else:
            assert out.ok and out.value == {0: i, 2: -i, 3: str(i), 4: i}[i % 5]


def test_sandboxed_jobs_including_one_killed_mid_run():
    programs = ["print(input())", "raise SystemExit(2)", "while True: pass", "import time; time.sleep(30)",
                "print(int(input()) + 1)"]

    def killer():  # SIGKILL a running sandbox process tree, as a crashed or OOM-killed worker would see
        deadline = time.time() + 20
        while time.time() < deadline:
            ps = subprocess.run(["pgrep", "-f", "sleep\\(30\\)"], capture_output=True, text=True).stdout.split()
            if ps:
                for pid in ps:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return
            time.sleep(0.02)

    thread = threading.Thread(target=killer)
    thread.start()
    with ExecutorPool(workers=2) as pool:
        outcomes = pool.run_many(lambda src: run_tests(src, [Test("7\n", "7\n")], Limits(time_limit_s=1)), programs * 8)
    thread.join()
    assert len(outcomes) == 40 and all(o.ok for o in outcomes)
    statuses = [o.value[0].status for o in outcomes]
    assert statuses[0::5] == ["ok"] * 8 and statuses[1::5] == ["runtime_error"] * 8
    assert statuses[2::5] == ["timeout"] * 8
    assert all(s in ("timeout", "runtime_error", "sandbox_error") for s in statuses[3::5])
    assert statuses[4::5] == ["wrong_answer"] * 8
    assert run_program("print(1)").stdout == "1\n"
