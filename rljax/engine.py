"""Rollouts over fixed decode slots (`rollout.engine = "slots"`): every live dialog decodes in one batch, and a
slot is refilled as soon as its turn is settled, instead of chunks that wait for their slowest answer.

The loop, on one host:
1. answers whose scores came back settle their dialogs: a dialog that goes on gets its feedback turn prefilled
   into its own slot (after what that slot's cache row holds); a dialog that is over frees its slot;
2. free slots take the next dialogs waiting to start (their prompts prefilled from column 0);
3. one `models.slots.decode` call runs every live slot for up to `check_every` tokens;
4. slots whose answer ended (stop id or the token budget) go to the executor pool at once, and the device keeps
   decoding the others while it scores them.
The device waits on the executor only when no slot is live and nothing can be admitted (`score_wait_s`).

Admissions in rounds (`rollout.admit_width` W > 0): one admission prefills its prompts and turns W tokens at a
time, every round one program of W columns; a segment's later chunks continue its slot's row, and a slot samples
its first token after its last chunk. Each distinct admission shape (segments, width, attention window) is a
compile, and without rounds every new longest-segment length is a new width: on bench_rollout's RLEF dialogs a
second rollout spent 83.6 s in admissions, most of it compiling shapes the first had not met (4-14 s each against
0.2-1.3 s for a known one); in rounds of 64 tokens, 28.7 s and no new shape. On a TPU this is chunked prefill,
the fixed token budget per step that a ragged-attention kernel serves.

Multi-host: every process runs this loop over the whole batch (the prompts gathered from every process, in
process order) and issues the same device calls. A process scores only its own dialogs' answers; between two
decode calls the processes exchange which of their dialogs were settled (and the ids of their next turns), so
they take the same scheduling decisions, and each returns its own dialogs' trajectories.

A dialog's tokens depend only on the dialog: dialog i samples the token at position p with the key
fold_in(fold_in(key, i), p), whatever slot it got and whatever order the scores arrived in. Recorded per dialog
exactly as `rljax.rollout.RolloutRunner` records it (the same `Trajectory`), so the learner sees no difference.
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import time
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from executor.pool import ExecutorPool
from models.kv_cache import KVCache
from models.sampler import FINISH_EOS, FINISH_LENGTH, Completion, Sampler, SamplingParams, attention_window
from models.sharding import host_array
from models.slots import SlotState, admit, decode, decodes_every_slot, host_rows, slot_order, slot_shards
from rljax.batching import round_up
from rljax.dialog import DialogCodec
from rljax.distributed import allgather_objects, gather_rows
from rljax.envs.base import Env, Episode
from rljax.rollout import RolloutRunner, RolloutStats, Trajectory

FREE, LIVE, SCORING, RESUMING = "free", "live", "scoring", "resuming"  # RESUMING: its next turn waits to be admitted
POLL_S = 0.02  # multi-host: how often the processes, all idle, check whether any score came back


class RoundEntry(NamedTuple):
    """One slot's part of an admission round: `ids` prefilled into `slot`'s row after its first `fill` columns
    (`reset`: a cleared row, a new dialog's first chunk). Entries with the same `share` key (not None: a GRPO
    group's prompt) share one segment; `final`: the slot samples its first token after this chunk."""
    slot: int
    ids: list[int]
    reset: bool
    share: tuple | None
    final: bool
    fill: int


class SlotRolloutRunner(RolloutRunner):
    """Runs a batch of episodes to the end on `num_slots` decode slots (see the module doc)."""

    refills_slots = True

    def __init__(self, sampler: Sampler, codec: DialogCodec, env: Env, pool: ExecutorPool, sampling: SamplingParams,
                 cache_capacity: int, num_slots: int, check_every: int = 16, decode_sizes: int = 4,
                 admit_rows: int = 0, admit_width: int = 0):
        super().__init__(sampler, codec, env, pool, sampling, cache_capacity)
        if num_slots < 1:
            raise ValueError(f"rollout.slots must be >= 1, got {num_slots}")
        if check_every < 1:
            raise ValueError(f"rollout.check_every must be >= 1, got {check_every}")
        if sampling.stop_strings:
            raise ValueError("rollout.engine 'slots' ends answers on stop ids only; stop strings need the "
                             "'chunks' engine")
        if decode_sizes < 1:
            raise ValueError(f"rollout.decode_sizes must be >= 1, got {decode_sizes}")
        if admit_rows < 0:
            raise ValueError(f"rollout.admit_rows must be >= 0, got {admit_rows}")
        self.num_slots, self.check_every, self.decode_sizes = num_slots, check_every, decode_sizes
        if admit_width < 0:
            raise ValueError(f"rollout.admit_width must be >= 0, got {admit_width}")
        self.admit_rows, self.admit_width = admit_rows, admit_width

    def run(self, episodes: Sequence[Episode], groups: Sequence[int], names: Sequence[str], key: jax.Array
            ) -> tuple[list[Trajectory], RolloutStats]:
        started = time.perf_counter()
        stats = RolloutStats()
        trajectories = [Trajectory(name, group) for name, group in zip(names, groups)]
        local_prompts = [self.codec.prompt_ids(episode.messages) for episode in episodes]
        every, offset = gather_rows(list(zip(local_prompts, names)))  # dialog i of the whole batch: every[i]
        mine = range(offset, offset + len(episodes))
        model = self.sampler.model
        slots = min(self.num_slots, len(every))
        cache = self.sampler.place_cache(KVCache.init(model.config, slots, self.cache_capacity,
                                                      self.sampler.cache_dtype))
        state = SlotState.init(cache, self.sampling.max_new_tokens)
        weights = self.sampler.weights()
        temperature, top_p = self.sampler.scalars(self.sampling)
        static = self.sampler.draw_static(self.sampling)
        granule = self._decode_granule(slots)
        compact = not decodes_every_slot(self.sampler._mesh_rules, slots)
        group = max(collections.Counter(groups).values(), default=1)  # answers per prompt (GRPO's G)
        order = slot_order(slots, slot_shards(self.sampler._mesh_rules, slots), group)
        owner, phase = [-1] * slots, [FREE] * slots
        scoring: dict[int, cf.Future] = {}  # slot -> the score of this process's dialog in it
        waiting = collections.deque(range(len(every)))
        resuming: collections.deque[tuple[int, list[int]]] = collections.deque()  # (slot, next turn's ids)
        rows = host_rows(state)
        while True:
            admissions: list[tuple[int, list[int], bool]] = []  # (slot, ids, new dialog)
            settled = self._settle(scoring, owner, offset, episodes, trajectories, rows, stats)
            can_start = bool(resuming) or (bool(waiting) and FREE in phase)
            if not settled and SCORING in phase and not can_start and LIVE not in phase:  # nothing to do
                t0 = time.perf_counter()
                while not settled:
                    if scoring:
                        cf.wait(list(scoring.values()), return_when=cf.FIRST_COMPLETED,
                                timeout=None if jax.process_count() == 1 else POLL_S)
                    settled = self._settle(scoring, owner, offset, episodes, trajectories, rows, stats)
                stats.score_wait_s += time.perf_counter() - t0
            for b in sorted(settled):
                if settled[b] is None:
                    owner[b], phase[b] = -1, FREE
                else:
                    resuming.append((b, [int(rows["last_b"][b])] + settled[b]))
                    phase[b] = RESUMING
            budget = self.admit_rows or slots  # segments one admission may prefill
            while resuming and budget:
                admissions.append(resuming.popleft() + (False,))
                budget -= 1
            prompts_in: set[tuple[int, ...]] = set()  # the new dialogs' distinct prompts (a group shares one)
            for b in order:
                if phase[b] == FREE and waiting:
                    i = waiting[0]
                    prompt, name = every[i]
                    if tuple(prompt) not in prompts_in:
                        if not budget:
                            break
                        prompts_in.add(tuple(prompt))
                        budget -= 1
                    waiting.popleft()
                    if len(prompt) + self.sampling.max_new_tokens > self.cache_capacity:
                        raise ValueError(f"rollout.cache_capacity ({self.cache_capacity}) is too small for dialog "
                                         f"{name!r}: its prompt ({len(prompt)} tokens) and max_new_tokens "
                                         f"({self.sampling.max_new_tokens})")
                    if i in mine:
                        trajectories[i - offset].append(prompt, sampled=False)
                    owner[b] = i
                    admissions.append((b, prompt, True))
            if not admissions and LIVE not in phase:
                if SCORING not in phase and not waiting:
                    break
                continue
            t0 = time.perf_counter()
            if admissions:
                state = self._admit(weights, state, admissions, owner, rows, key, temperature, top_p, static,
                                    stats)
                for b, _, _ in admissions:
                    phase[b] = LIVE
                rows = host_rows(state)
                stats.admit_s += time.perf_counter() - t0
            live = rows["live_b"]  # only admitted (LIVE) slots are live on the device
            if live.any():
                window = attention_window(min(int(rows["fill_b"][live].max()) + self.check_every,
                                              self.cache_capacity), self.cache_capacity)
                rows_c = self._decode_rows(np.flatnonzero(live), slots, granule) if compact else None
                if rows_c is not None and len(rows_c) == slots and window == self.cache_capacity:
                    rows_c = None  # every slot over the whole cache: in place, no gather (models.slots.decode)
                state = decode(*weights, state, None if rows_c is None else jnp.asarray(rows_c), key, temperature,
                               top_p, static=static, mesh_rules=self.sampler._mesh_rules, window=window,
                               steps=self.check_every)
                computed = slots if rows_c is None else len(rows_c)
                before, rows = rows["count_b"], host_rows(state)
                steps = int((rows["count_b"] - before)[live].max())
                stats.decode_steps += steps
                stats.decode_slot_steps += steps * computed
                stats.decode_kv_slots_read += steps * computed * window
            stats.generate_s += time.perf_counter() - t0
            finished = [b for b in range(slots) if phase[b] == LIVE and not rows["live_b"][b]]
            if finished:
                tokens, logprobs, entropies = (host_array(x) for x in (state.tokens_bn, state.logprobs_bn,
                                                                        state.entropy_bn))
                for b in finished:
                    phase[b] = SCORING
                    if owner[b] not in mine:  # another process scores it
                        continue
                    n = int(rows["count_b"][b])
                    ids = tokens[b, :n].tolist()
                    reason = FINISH_EOS if ids and ids[-1] in self.sampling.stop_ids else FINISH_LENGTH
                    completion = Completion(ids, logprobs[b, :n].copy(), None, reason, entropies[b, :n].copy())
                    scoring[b] = self._record_answer(owner[b] - offset, completion, episodes, trajectories, stats)
        stats.total_s = time.perf_counter() - started
        return trajectories, stats

    def _settle(self, scoring: dict[int, cf.Future], owner: list[int], offset: int, episodes: Sequence[Episode],
                trajectories: list[Trajectory], rows: dict[str, np.ndarray], stats: RolloutStats
                ) -> dict[int, list[int] | None]:
        """{slot: the ids of its dialog's next turn, or None when the dialog is over} for every slot whose score
        came back, on this process or (multi-host) on any: each process settles its own dialogs (their results
        and next turns go into its trajectories) and the processes exchange what they settled."""
        settled: dict[int, list[int] | None] = {}
        for b in sorted(b for b, future in scoring.items() if future.done()):
            i = owner[b] - offset
            self._take_result(trajectories[i], scoring.pop(b).result(), stats)
            room = self.cache_capacity - int(rows["fill_b"][b]) - self.sampling.max_new_tokens
            settled[b] = self._next_turn(episodes[i], trajectories[i], room, stats)
        if jax.process_count() == 1:
            return settled
        return {b: ids for part in allgather_objects(settled) for b, ids in part.items()}

    def _decode_granule(self, slots: int) -> int:
        """Decode calls compute a multiple of this many rows, slots / decode_sizes, so a run compiles at most
        `decode_sizes` batch sizes per window."""
        return max(1, -(-slots // self.decode_sizes))

    @staticmethod
    def _decode_rows(live: np.ndarray, slots: int, granule: int) -> np.ndarray:
        """The slots one decode call computes: the live ones, padded (with `slots`, past the batch) to a multiple
        of `granule`."""
        count = min(slots, -(-len(live) // granule) * granule)
        return np.concatenate([live, np.full(count - len(live), slots)]).astype(np.int32)

    def _admit(self, weights: tuple, state: SlotState, admissions: list[tuple[int, list[int], bool]],
               owner: list[int], rows: dict[str, np.ndarray], key: jax.Array, temperature: jax.Array,
               top_p: jax.Array, static: object, stats: RolloutStats | None = None) -> SlotState:
        """Prefill every admitted (slot, ids, new dialog) and start its slot, in rounds: round k prefills each
        entry's tokens [k W, (k + 1) W) for W = `rollout.admit_width` (0: one round of whole entries), and an entry
        samples its first token in its last round. Each round is one `models.slots.admit` call of
        `_admit_round`."""
        longest = max(len(ids) for _, ids, _ in admissions)
        chunk = self.admit_width or longest
        for k in range(-(-longest // chunk)):
            entries = [RoundEntry(b, ids[k * chunk:(k + 1) * chunk], new and k == 0, tuple(ids) if new else None,
                                  len(ids) <= (k + 1) * chunk, (0 if new else int(rows["fill_b"][b])) + k * chunk)
                       for b, ids, new in admissions if len(ids) > k * chunk]
            state = self._admit_round(weights, state, entries, owner, key, temperature, top_p, static, stats)
        return state

    def _admit_round(self, weights: tuple, state: SlotState,
                     entries: list[RoundEntry], owner: list[int],
                     key: jax.Array, temperature: jax.Array, top_p: jax.Array, static: object,
                     stats: RolloutStats | None) -> SlotState:
        """One prefill of `RoundEntry`s: each is its own segment, but entries with the same share key (a GRPO
        group's prompt) share one. The segment count is padded to a
        power of two, the width to `rollout.admit_width` (0: as `segment_width` pads the longest segment), the
        slots to the batch, so a run compiles few variants. Where the mesh splits the slots into blocks
        (`models.slots.slot_shards`), each block gets its own segments (a group's prompt is computed once per
        block that holds its slots), so every key and value is computed and written on its slot's chips. `stats`
        counts the tokens prefilled and the token slots computed."""
        slots = len(owner)
        shards = slot_shards(self.sampler._mesh_rules, slots)
        segments, starts, per_block, per_block_a = admission_layout(entries, slots, shards)
        block = slots // shards
        width = self.admit_width or segment_width(max(len(ids) for x in segments for ids, _, _ in x),
                                                  self.sampler.length_bucket)
        count, width_a = per_block * shards, per_block_a * shards
        tokens = np.full((count, width), self.sampler.pad_id, np.int32)
        length, reset_u = np.zeros(count, np.int32), np.ones(count, bool)
        row_u = np.repeat(np.arange(shards, dtype=np.int32) * block, per_block)  # padding: the block's first slot
        slot_a = np.full(width_a, slots, np.int32)
        source_a = np.repeat(np.arange(shards, dtype=np.int32) * per_block, per_block_a)
        sequence_a, final_a = np.zeros(width_a, np.int32), np.ones(width_a, bool)
        for s in range(shards):
            for j, (ids, b, reset) in enumerate(segments[s]):
                u = s * per_block + j
                tokens[u, :len(ids)], length[u], row_u[u], reset_u[u] = ids, len(ids), b, reset
            for j, (b, u, final) in enumerate(starts[s]):
                a = s * per_block_a + j
                slot_a[a], source_a[a], sequence_a[a], final_a[a] = b, s * per_block + u, owner[b], final
        self.sampler.check_token_ids(tokens, "rollout")
        if stats is not None:
            stats.admit_tokens += int(length.sum())
            stats.admit_token_slots += tokens.size
        window = attention_window(max(e.fill + len(e.ids) for e in entries), self.cache_capacity)
        arrays = (tokens, length, row_u, reset_u, slot_a, source_a, sequence_a)
        return admit(*weights, state, *(jnp.asarray(x) for x in arrays), key, temperature, top_p, static=static,
                     mesh_rules=self.sampler._mesh_rules, window=window,
                     fresh=all(e.reset for e in entries), shards=shards,
                     final_a=jnp.asarray(final_a))


def segment_width(longest: int, bucket: int) -> int:
    """The width an admission pads its segments to: the longest, rounded up to a multiple of `bucket`
    (`rollout.length_bucket`), as the chunked rollout pads its prefills. Powers of two compiled fewer variants
    but computed up to twice the tokens: 16 SmolLM2 prompts of 300-315 tokens took 17.0 s at 512 columns, 11.8 s
    at 320 (XLA:CPU)."""
    return round_up(longest, bucket)


def admission_layout(entries: Sequence[RoundEntry], slots: int, shards: int
                     ) -> tuple[list[list[tuple[list[int], int, bool]]], list[list[tuple[int, int, bool]]], int, int]:
    """How one admission round's entries are laid out over the `shards` blocks of consecutive slots: per block,
    its segments (ids, the slot whose row it prefills, reset) and its starts (slot, the index of its segment in
    the block, final), entries with the same share key (not None) in one block sharing a segment; then the
    segments and the starts per block, padded to powers of two (at most a block)."""
    block = slots // shards
    segments: list[list[tuple[list[int], int, bool]]] = [[] for _ in range(shards)]
    starts: list[list[tuple[int, int, bool]]] = [[] for _ in range(shards)]
    first_of: list[dict[tuple, int]] = [{} for _ in range(shards)]
    for e in entries:
        s = e.slot // block
        u = first_of[s].setdefault(e.share, len(segments[s])) if e.share is not None else len(segments[s])
        if u == len(segments[s]):
            segments[s].append((e.ids, e.slot, e.reset))
        starts[s].append((e.slot, u, e.final))
    per_block = min(1 << (max(len(x) for x in segments) - 1).bit_length(), block)
    per_block_a = min(1 << (max(len(x) for x in starts) - 1).bit_length(), block)
    return segments, starts, per_block, per_block_a


def rollout_runner(config: object, sampler: Sampler, codec: DialogCodec, env: Env, pool: ExecutorPool,
                   sampling: SamplingParams, dialogs: int) -> RolloutRunner:
    """The rollout `config.rollout.engine` names; the slots engine gets `rollout.slots` slots (0: `dialogs`, the
    most one call runs at once)."""
    r = config.rollout
    if r.engine == "slots":
        return SlotRolloutRunner(sampler, codec, env, pool, sampling, r.cache_capacity, r.slots or dialogs,
                                 r.check_every, r.decode_sizes, r.admit_rows, r.admit_width)
    return RolloutRunner(sampler, codec, env, pool, sampling, r.cache_capacity, r.num_chunks)
