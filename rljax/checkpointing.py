"""Training checkpoints with orbax's CheckpointManager: policy and value TrainStates (params + optimizer
state + step), the KL reference's trainable params when it is not the initial policy (after a supervised
warm-up), and a JSON record of the step, the data stream position and the run's counters.

Array trees are stored as flat, ordered leaf dicts and restored into the live states' structure and
shardings, so a checkpoint restores onto any mesh (and host count) for the same config. Saves are async;
only finished saves are ever restored, so a run killed mid-save resumes from the previous one.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"
log = logging.getLogger("rljax.checkpointing")


class ResumeError(ValueError):
    """Resuming was required but there is no usable checkpoint."""


def _flat(tree: Any) -> dict[str, Any]:
    return {f"{i:06d}": leaf for i, leaf in enumerate(jax.tree.leaves(tree))}


def _abstract(tree: Any) -> dict[str, Any]:
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding) for k, v in _flat(tree).items()}


class TrainCheckpointer:
    def __init__(self, workdir: str | Path, every_steps: int, keep: int, async_save: bool = True):
        self.directory = (Path(workdir) / CHECKPOINT_DIR).absolute()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, save_interval_steps=every_steps,
                                               enable_async_checkpointing=async_save, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options,
                                             item_names=("policy", "value", "reference", "meta"))

    def save(self, step: int, states: dict[str, Any], meta: dict[str, Any], force: bool = False) -> bool:
        """Save (when the interval says so, or `force`); returns whether a save started."""
        args = {name: ocp.args.StandardSave(_flat(state)) for name, state in states.items() if state is not None}
        args["meta"] = ocp.args.JsonSave(meta)
        return self.manager.save(step, args=ocp.args.Composite(**args), force=force)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def restore(self, step: int, states: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The states (same structure as the given live ones) and the meta record saved at `step`."""
        args = {name: ocp.args.StandardRestore(_abstract(state)) for name, state in states.items()
                if state is not None}
        args["meta"] = ocp.args.JsonRestore()
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(**args))
        except Exception as err:  # orbax raises many types for a damaged or mismatched checkpoint
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ResumeError(f"{self.directory}/{step}: cannot restore ({type(err).__name__}: {first[:200]})"
                              ) from None
        out = {}
        for name, state in states.items():
            if state is None:
                out[name] = None
                continue
            leaves = [restored[name][k] for k in sorted(restored[name])]
            out[name] = jax.tree.unflatten(jax.tree.structure(state), leaves)
        return out, dict(restored["meta"])

    def read_meta(self, step: int) -> dict[str, Any]:
        """The JSON record saved at `step` (no arrays are read)."""
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        except Exception as err:  # a damaged record: the full restore reports it
            log.debug("meta of step %d unreadable: %s", step, err)
            return {}
        return dict(restored["meta"])

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()
