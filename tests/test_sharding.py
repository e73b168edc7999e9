"""Sharding rules and the 1-device vs 8-device (fsdp=4 x tensor=2) equality, in a subprocess."""
import json
import subprocess
import sys

from jax.sharding import PartitionSpec

from models.sharding import logical_to_spec
from tests.conftest import REPO, host_devices_env


class _FakeMesh:
    shape = {"data": 1, "fsdp": 4, "tensor": 2}


def test_rules_map_logical_axes_and_replicate_indivisible_dims():
    mesh = _FakeMesh()
    assert logical_to_spec(("layers", "embed", "heads", "head_dim"), (2, 64, 4, 16), mesh) == \
        PartitionSpec(None, "fsdp", "tensor", None)
    # 3 KV heads do not divide over tensor=2: replicated rather than failing (SmolLM2 has 3)
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), (576, 3, 64), mesh) == \
        PartitionSpec("fsdp", None, None)
    assert logical_to_spec(("batch", None), (8, 5), mesh) == PartitionSpec("fsdp", None)


def test_eight_device_mesh_matches_one_device():
    env = host_devices_env(8, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "_mesh_check.py")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["n_devices_used"] == 8
    assert "P(None, 'fsdp', 'tensor', None)" in result["param_specs"]  # q_dnh: layers, embed, heads, head_dim
    assert result["max_diff"] <= 1e-5
