"""Multi-host training with two local `jax.distributed` processes (gloo collectives on CPU), each with 4
simulated devices, against one process with 8: same GRPO metrics step by step, on the chunked rollout and on the
slots engine, and a checkpoint written by the two processes resumes on one."""
import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import host_devices_env

REPO = Path(__file__).resolve().parents[1]
RUN = [sys.executable, "tests/_multihost_run.py"]


def _result(stdout: str) -> list[dict]:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, stdout[-2000:]
    return json.loads(lines[0][len("RESULT "):])


def _single(workdir: Path, steps: int, engine: str = "chunks", devices: int = 8) -> list[dict]:
    proc = subprocess.run(RUN + [str(workdir), str(steps), engine], cwd=REPO, env=host_devices_env(devices),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _result(proc.stdout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(workdir: Path, steps: int, engine: str = "chunks", devices_each: int = 4) -> list[dict]:
    port = _free_port()
    procs = [subprocess.Popen(RUN + [str(workdir), str(steps), engine, str(i), "2", str(port)], cwd=REPO,
                              env=host_devices_env(devices_each),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=600))
    finally:
        for proc in procs:
            proc.kill()
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-3000:]
    assert "RESULT" not in outputs[1][0]  # only process 0 reports
    return _result(outputs[0][0])


def _assert_same(a: dict, b: dict) -> None:
    assert a["step"] == b["step"]
    for key in a:
        if key not in ("step", "devices", "processes") and key in b:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (key, a, b)


def test_two_processes_match_one_and_checkpoint_restores_on_one(tmp_path):
    reference = _single(tmp_path / "one", 3)
    assert [r["processes"] for r in reference] == [1] * 3 and reference[0]["devices"] == 8
    multi = _two_processes(tmp_path / "two", 3)
    assert [r["processes"] for r in multi] == [2] * 3 and multi[0]["devices"] == 8
    for a, b in zip(reference, multi):
        _assert_same(a, b)
    assert len({r["train/grad_norm"] for r in multi}) == 3  # the steps differ: the update did something
    # the two processes wrote one checkpoint directory; drop its last step and resume on one process
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "two", resumed)
    shutil.rmtree(resumed / "checkpoints" / "3")
    after = _single(resumed, 3)
    assert [r["step"] for r in after] == [3]
    _assert_same(reference[2], after[0])


def test_slots_engine_on_two_processes_matches_one(tmp_path):
    """The slots engine (dialogs of up to 3 turns with feedback, some ending as context_full, 4 slots refilled
    over the 16 dialogs of a step) on two processes of one device each, the second of which scores its answers
    later, samples, counts and learns what one process with two devices does."""
    reference = _single(tmp_path / "one", 2, "slots", devices=2)
    multi = _two_processes(tmp_path / "two", 2, "slots", devices_each=1)
    assert [r["processes"] for r in multi] == [2, 2] and multi[0]["devices"] == 2
    assert all(r["turns/mean"] > 2 for r in reference)  # feedback turns were prefilled into refilled slots
    assert reference[0]["rollout/context_full"] > 0  # counted over both processes' dialogs below
    for a, b in zip(reference, multi):
        _assert_same(a, b)
