"""Multi-host runs on JAX's own multi-controller runtime (`jax.distributed`), and the few host-side
collectives the training loop needs on top of it.

How a multi-host rljax run divides the work: every process reads the same problem stream and takes its
contiguous share of each global batch; it resets and scores the environments of its share on its own executor
pool. Device work (generation, scoring passes, updates) runs on the global mesh over all hosts' devices, so the
sampler is called with the global batch on every process (prompts are gathered first) and each process keeps
its own rows of the result. Finished dialogs are gathered to every host, where the rewards, KL and advantages
of the whole batch are computed identically (GRPO groups and PPO's batch statistics may span hosts).
"""
from __future__ import annotations

import logging
import os
import pickle
from typing import Any, Sequence

import jax
import numpy as np
from ml_collections import ConfigDict

log = logging.getLogger("rljax.distributed")

MODES = ("off", "auto", "explicit")
ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID = "RLJAX_COORDINATOR_ADDRESS", "RLJAX_NUM_PROCESSES", "RLJAX_PROCESS_ID"


def distributed_config() -> ConfigDict:
    """The `distributed` block of a run config (see `initialize`)."""
    return ConfigDict({"mode": "off", "coordinator_address": "", "num_processes": 0, "process_id": -1,
                       "initialization_timeout_s": 300})


def initialize(cfg: ConfigDict) -> None:
    """Join the processes of a multi-host run before any JAX computation.

    mode "off": one process. "auto": `jax.distributed.initialize()` detects the cluster (TPU VM slices, SLURM,
    Kubernetes, ...). "explicit": coordinator address, process count and this process's id from the config, or
    where a value is unset from the environment (RLJAX_COORDINATOR_ADDRESS, RLJAX_NUM_PROCESSES, RLJAX_PROCESS_ID),
    so every host can run the same command with its own id. CPU collectives go over gloo.
    """
    if cfg.mode not in MODES:
        raise ValueError(f"config.distributed.mode: {cfg.mode!r} is not one of {list(MODES)}")
    if cfg.mode == "off" or jax.distributed.is_initialized():
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = int(cfg.get("initialization_timeout_s", 300))
    if cfg.mode == "auto":
        jax.distributed.initialize(initialization_timeout=timeout)
    else:
        address = cfg.coordinator_address or os.environ.get(ENV_COORDINATOR, "")
        count = cfg.num_processes if cfg.num_processes > 0 else _env_int(ENV_NUM_PROCESSES)
        index = cfg.process_id if cfg.process_id >= 0 else _env_int(ENV_PROCESS_ID)
        if not address or count is None or index is None:
            raise ValueError("config.distributed: mode 'explicit' needs coordinator_address, num_processes and "
                             f"process_id (in the config or ${ENV_COORDINATOR}, ${ENV_NUM_PROCESSES}, "
                             f"${ENV_PROCESS_ID}); got {address!r}, {count!r}, {index!r}")
        if not 0 <= index < count:
            raise ValueError(f"config.distributed.process_id: {index} is not in [0, {count})")
        jax.distributed.initialize(address, num_processes=count, process_id=index, initialization_timeout=timeout)
    log.info("process %d of %d: %d local devices, %d in all", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"${name}: expected an integer, got {value!r}") from None


def is_primary() -> bool:
    """Whether this process writes the run's shared files (metrics, reports)."""
    return jax.process_index() == 0


def allgather_objects(obj: Any) -> list[Any]:
    """Every process's `obj` (picklable), in process order, on every process."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int32))).reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return [pickle.loads(gathered[i, :sizes[i]].tobytes()) for i in range(len(sizes))]


def gather_rows(local: Sequence[Any]) -> tuple[list[Any], int]:
    """(the concatenation of every process's `local` rows in process order, this process's offset in it)."""
    parts = allgather_objects(list(local))
    offset = sum(len(p) for p in parts[:jax.process_index()])
    return [row for part in parts for row in part], offset


def local_share(total: int) -> slice:
    """This process's contiguous share of `total` global rows (which the process count must divide)."""
    count, index = jax.process_count(), jax.process_index()
    if total % count:
        raise ValueError(f"a global batch of {total} does not split evenly over {count} processes")
    size = total // count
    return slice(index * size, (index + 1) * size)
