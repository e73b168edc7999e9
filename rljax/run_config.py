"""From an ml_collections run config to the parts of a run, with one-line errors for bad values.

Every config file in configs/ starts from `base_config()` (all keys, RLEF's defaults) and changes what its
run needs: model, problems, environment, rollout, algorithm, optimizers, mesh and checkpointing.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ml_collections import ConfigDict

from executor.extract import extract_code
from executor.testing import Limits
from models.llama import Llama
from rljax.distributed import MODES as DISTRIBUTED_MODES
from rljax.distributed import distributed_config
from rljax.envs import RLEFEnv, RLEFRewards, SWERLEnv
from rljax.learner import ALGORITHMS, LossConfig, OptimConfig
from rljax.advantages import BASELINES
from rljax.ppo import AGGREGATIONS, RATIO_LEVELS
from rljax.grpo import KL_ESTIMATORS, KL_PLACEMENTS

def base_config() -> ConfigDict:
    """Every key of a run config, with RLEF's defaults."""
    c = ConfigDict()
    c.workdir = "runs/default"
    c.seed = 0
    c.total_steps = 100
    c.codec = "chat"  # chat (the tokenizer's chat template) | digits (the toy task's 14-token vocabulary)

    # dtype: the compute dtype of activations, matmuls and the KV cache ("" keeps the checkpoint's own);
    # param_dtype: the weights the optimizer updates and their AdamW moments ("" keeps the checkpoint's own).
    # float32 master weights by default: a bfloat16 weight of magnitude 0.02 moves only in steps of ~1e-4
    # (8 significant bits), so AdamW steps of ~lr = 2e-7 (the RLEF paper's rate) would round away on every weight
    # architecture: the preset a checkpoint must match (lets `rljax plan` size a run without the weights);
    # remat: none | full | dots_saveable for the training passes ("" keeps the model's own)
    # lora: adapters on the comma-listed projections (q,k,v,o,gate,up,down or all; "" = full fine-tuning) with
    # rank and alpha (update scale alpha / rank); only the adapters train (models/lora.py)
    # tokenizer: with a random preset, "smollm2" or a checkpoint directory whose tokenizer (and chat template)
    # the run uses (the preset's vocab_size must hold it); checkpoints bring their own
    c.model = ConfigDict({"preset": "", "overrides": {}, "init_seed": 0, "checkpoint": "", "pretrained": "",
                          "dtype": "", "param_dtype": "float32", "architecture": "", "remat": "", "tokenizer": "",
                          "lora": {"targets": "", "rank": 16, "alpha": 32.0}})
    # source: toy | jsonl (path) | bundled (32 demo problems) | practice / practice_heldout (rljax.data.practice:
    # 320 training problems, 48 held-out ones of other task families) | humaneval | code_contests (path: shards)
    # | swerl_practice / swerl_practice_heldout (SWE-RL instances mined from rljax.data.bugfix_repo: 32 / 16)
    c.data = ConfigDict({"source": "jsonl", "path": "", "toy_count": 10, "toy_digits": 1, "max_problems": 0,
                         "generated_as_private": False})
    c.env = ConfigDict({
        "name": "rlef", "max_turns": 3, "feedback_mode": "full", "code_builder": "python_block", "prompt": "",
        "rewards": {"solved": 1.0, "failed": -1.0, "no_code": -0.2, "intermediate": 0.0},
        "time_limit_s": 10.0, "memory_limit_mb": 1024, "use_problem_limits": True, "reward_variant": "similarity",
        # test_cache_mb: a program already run on the same tests gets its stored results (outputs up to this
        # many MiB of characters; 0 runs every answer)
        "test_cache_mb": 256})
    c.rollout = ConfigDict({
        "problems_per_step": 8, "samples_per_problem": 1, "max_new_tokens": 512, "temperature": 1.0, "top_p": 1.0,
        "top_k": 0, "cache_capacity": 4096, "length_bucket": 64, "num_chunks": 2, "executor_workers": 0,
        # engine: chunks (rljax.rollout: the batch in num_chunks lockstep chunks) | slots (rljax.engine: every live
        # dialog in one decode batch of `slots` slots, 0 = all dialogs of the batch, refilled as turns end;
        # a decode call computes only the live slots, rounded up to one of `decode_sizes` batch sizes; one admission
        # prefills at most `admit_rows` prompts and turns, 0 = no cap: the rest wait for the next one; it prefills
        # them in rounds of `admit_width` tokens each, a multiple of length_bucket, so its programs have one width;
        # 0 = whole, each round's width the longest segment's rounded up to length_bucket)
        "engine": "chunks", "slots": 0, "check_every": 16, "decode_sizes": 4, "admit_rows": 0, "admit_width": 0,
        # replicate_weights: each rollout call copies the weights whole onto every data/fsdp shard (split over
        # tensor only), so decode steps read local weights instead of gathering them over the mesh every step
        "replicate_weights": True})
    # policy-optimisation variants (README "Variants"; the defaults are the papers' settings):
    # clip_eps_high (0 = clip_eps) and dual_clip (0 = off) on the ratio; ratio_level token | sequence (GSPO);
    # group_baseline group_mean | leave_one_out (RLOO); scale_by_std False + aggregation constant_length is
    # Dr.GRPO; tis_cap > 0 truncated importance sampling; overlong_buffer > 0 DAPO's soft length penalty
    # (overlong_penalty at the budget); mask_truncated drops answers cut at the budget from the loss;
    # dynamic_sampling_rounds > 0 re-draws problems whose groups all scored the same (DAPO)
    c.algo = ConfigDict({
        "name": "ppo", "kl_beta": 0.05, "gamma": 1.0, "lam": 0.95, "normalize_advantages": False,
        "clip_eps": 0.2, "value_clip": 0.2, "entropy_coef": 0.0, "aggregation": "token_mean", "epochs": 1,
        "kl_placement": "reward", "kl_estimator": "k3", "group_eps": 1e-6, "scale_by_std": True,
        "clip_eps_high": 0.0, "dual_clip": 0.0, "ratio_level": "token", "group_baseline": "group_mean",
        "tis_cap": 0.0, "overlong_buffer": 0, "overlong_penalty": 1.0, "mask_truncated": False,
        "dynamic_sampling_rounds": 0})
    # supervised warm-up before RL step 1 (rljax.warmup; steps 0 = off, as both papers): `steps` steps of
    # `batch` demonstrations of the training rows (Env.demonstration), cross-entropy on the answer tokens with a
    # constant learning rate of its own
    c.warmup = ConfigDict({"steps": 0, "batch": 4, "micro_batches": 1, "learning_rate": 1e-4})
    c.optim = ConfigDict({"learning_rate": 2e-7, "warmup_steps": 50, "weight_decay": 0.1, "b1": 0.9, "b2": 0.95,
                          "eps": 1e-8, "max_grad_norm": 1.0, "optimizer": "adamw"})
    c.value_optim = ConfigDict(c.optim.to_dict())
    # vocab_chunk: sequence positions per chunk of the log-softmax over the vocabulary (models/logprobs.py);
    # share_prompts: the rows of a micro-batch that share a prompt (a GRPO group) compute it once in the update
    # (rows packed group by group; rljax.batching.shared_prefixes)
    c.train = ConfigDict({"micro_batches": 1, "seq_bucket": 64, "vocab_chunk": LossConfig.vocab_chunk,
                          "share_prompts": False})
    c.mesh = ConfigDict({"data": 1, "fsdp": -1, "tensor": 1})
    c.checkpoint = ConfigDict({"every": 50, "keep": 3, "async_save": True, "resume": "auto"})
    # samples_per_step: the first that many dialogs of each step go to WORKDIR/samples.jsonl (0: none)
    c.log = ConfigDict({"tensorboard": True, "progress": True, "samples_per_step": 4})
    c.distributed = distributed_config()  # multi-host: see rljax.distributed.initialize
    # evaluation (rljax eval, the demo): source "" = the training data; n_at_k a comma list like "1@3,10@100";
    # max_turns 0 = env.max_turns (a run may train on one-answer dialogs and evaluate RLEF's 3-turn 1@3)
    c.eval = ConfigDict({"source": "", "path": "", "max_problems": 0, "samples_per_problem": 1, "max_turns": 0,
                         "temperature": 0.2,
                         "top_p": 1.0, "max_new_tokens": 0, "n_at_k": "1@3", "batch_dialogs": 16,
                         "bootstrap_resamples": 2000, "seed": 0})
    return c


DATA_SOURCES = ("toy", "jsonl", "bundled", "practice", "practice_heldout", "humaneval", "code_contests",
                "swerl_practice", "swerl_practice_heldout")
CHOICES = {
    "algo.name": ALGORITHMS, "algo.aggregation": AGGREGATIONS, "algo.kl_estimator": KL_ESTIMATORS,
    "algo.kl_placement": KL_PLACEMENTS, "env.name": ("rlef", "swerl"), "env.feedback_mode": ("full", "none", "unrelated"),
    "env.code_builder": ("python_block", "digits"), "codec": ("chat", "digits"),
    "data.source": DATA_SOURCES, "eval.source": ("",) + DATA_SOURCES,
    "checkpoint.resume": ("auto", "require", "never"), "distributed.mode": DISTRIBUTED_MODES,
    "model.remat": ("", "none", "full", "dots_saveable"),
    "model.param_dtype": ("", "float32", "bfloat16", "float16"),
    "algo.ratio_level": RATIO_LEVELS, "algo.group_baseline": BASELINES, "rollout.engine": ("chunks", "slots"),
    "train.share_prompts": (False, True),
}
POSITIVE = ("total_steps", "rollout.problems_per_step", "rollout.samples_per_problem", "rollout.max_new_tokens",
            "rollout.cache_capacity", "rollout.length_bucket", "rollout.num_chunks", "train.micro_batches",
            "train.seq_bucket", "train.vocab_chunk", "checkpoint.every", "checkpoint.keep", "env.max_turns", "algo.epochs",
            "eval.samples_per_problem", "eval.batch_dialogs", "eval.bootstrap_resamples", "warmup.batch",
            "warmup.micro_batches", "rollout.check_every", "rollout.decode_sizes")
NON_NEGATIVE = ("log.samples_per_step", "warmup.steps", "rollout.slots", "rollout.admit_rows", "rollout.admit_width",
                "env.test_cache_mb")


def _get(config: ConfigDict, dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if part not in value:
            raise ValueError(f"config.{dotted}: missing (every run config needs it; see rljax.run_config.base_config)")
        value = value[part]
    return value


def validate(config: ConfigDict) -> None:
    """Refuse a config whose values cannot work, naming the key and what was expected."""
    for key in ("workdir", "seed", "total_steps"):
        _get(config, key)
    for key, choices in CHOICES.items():
        value = _get(config, key)
        if value not in choices:
            raise ValueError(f"config.{key}: {value!r} is not one of {list(choices)}")
    for key in POSITIVE:
        value = _get(config, key)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"config.{key}: expected a positive integer, got {value!r}")
    for key in NON_NEGATIVE:
        value = _get(config, key)
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"config.{key}: expected an integer >= 0, got {value!r}")
    if config.rollout.admit_width % config.rollout.length_bucket:
        raise ValueError(f"config.rollout.admit_width: {config.rollout.admit_width} is not a multiple of "
                         f"rollout.length_bucket ({config.rollout.length_bucket})")
    batch = config.rollout.problems_per_step * config.rollout.samples_per_problem
    if batch % config.train.micro_batches:
        raise ValueError(f"config.train.micro_batches: {config.train.micro_batches} does not divide the rollout "
                         f"batch of {batch} dialogs (problems_per_step * samples_per_problem)")
    if config.warmup.batch % config.warmup.micro_batches:
        raise ValueError(f"config.warmup.micro_batches: {config.warmup.micro_batches} does not divide "
                         f"warmup.batch ({config.warmup.batch})")
    if config.warmup.steps and not config.warmup.learning_rate > 0:
        raise ValueError(f"config.warmup.learning_rate: expected > 0, got {config.warmup.learning_rate!r}")
    if not 0 < config.rollout.top_p <= 1 or config.rollout.temperature <= 0:
        raise ValueError("config.rollout: training samples need temperature > 0 and top_p in (0, 1], got "
                         f"temperature={config.rollout.temperature}, top_p={config.rollout.top_p}")
    if not 0 < config.eval.top_p <= 1 or config.eval.temperature < 0:
        raise ValueError("config.eval: need temperature >= 0 (0 = greedy) and top_p in (0, 1], got "
                         f"temperature={config.eval.temperature}, top_p={config.eval.top_p}")
    from rljax.eval import parse_n_at_k

    for spec in config.eval.n_at_k.split(","):
        if spec.strip():
            try:
                parse_n_at_k(spec)
            except ValueError as err:
                raise ValueError(f"config.eval.n_at_k: {err}") from None
    a = config.algo
    if a.dual_clip and not a.dual_clip > 1:
        raise ValueError(f"config.algo.dual_clip: expected 0 (off) or a value > 1, got {a.dual_clip}")
    for key in ("clip_eps_high", "tis_cap", "overlong_buffer", "dynamic_sampling_rounds"):
        if a[key] < 0:
            raise ValueError(f"config.algo.{key}: expected >= 0 (0 = off), got {a[key]!r}")
    if a.overlong_buffer > config.rollout.max_new_tokens:
        raise ValueError(f"config.algo.overlong_buffer: {a.overlong_buffer} is more than rollout.max_new_tokens "
                         f"({config.rollout.max_new_tokens})")
    if a.ratio_level == "sequence" and a.aggregation == "token_mean":
        raise ValueError("config.algo.ratio_level: 'sequence' (GSPO) averages over sequences; set "
                         "algo.aggregation to sequence_mean (token_mean would weigh each sequence by its length)")
    grouped = a.name == "grpo"
    if not grouped and (a.group_baseline != "group_mean" or a.dynamic_sampling_rounds):
        raise ValueError("config.algo.group_baseline / dynamic_sampling_rounds: group variants need algo.name grpo")
    if a.group_baseline == "leave_one_out" and config.rollout.samples_per_problem < 2:
        raise ValueError("config.algo.group_baseline: leave_one_out needs rollout.samples_per_problem >= 2")
    eval_turns = _get(config, "eval.max_turns")
    if not isinstance(eval_turns, int) or eval_turns < 0:
        raise ValueError(f"config.eval.max_turns: expected an integer >= 0 (0 = env.max_turns), got {eval_turns!r}")
    if config.env.name == "swerl" and config.env.max_turns != 1:
        raise ValueError("config.env.max_turns: SWE-RL has a single turn; set it to 1")
    model = config.model
    lora_config(model)
    if sum(bool(model.get(k)) for k in ("preset", "checkpoint", "pretrained")) != 1:
        raise ValueError("config.model: set exactly one of preset (random init), checkpoint (a path) or "
                         "pretrained ('smollm2')")


def build_mesh(cfg: ConfigDict) -> Any:
    from models.sharding import make_mesh

    return make_mesh(data=cfg.data, fsdp=cfg.fsdp, tensor=cfg.tensor)


def architecture_preset(name: str) -> Any:
    """The LlamaConfig preset `model.architecture` names."""
    from models.config import PRESETS

    if name not in PRESETS:
        raise ValueError(f"config.model.architecture: {name!r} is not one of {sorted(PRESETS)}")
    return PRESETS[name]


def model_architecture(cfg: ConfigDict) -> Any:
    """The LlamaConfig a run's model block names, without loading weights: the preset (with overrides), the
    bundled SmolLM2's, a checkpoint's config.json where it is here, else the `model.architecture` preset;
    with the block's dtype, param_dtype and remat applied."""
    from models.checkpoint import read_config
    from models.config import PRESETS, LlamaConfig

    if cfg.get("preset"):
        arch = LlamaConfig.preset(cfg.preset, **dict(cfg.get("overrides") or {}))
    elif cfg.get("pretrained"):
        arch = PRESETS["smollm2_135m"]
    elif cfg.get("checkpoint") and Path(cfg.checkpoint).is_dir():
        arch = read_config(cfg.checkpoint)
    elif cfg.get("architecture"):
        arch = architecture_preset(cfg.architecture)
    else:
        raise ValueError(f"config.model: checkpoint {cfg.get('checkpoint')!r} is not here and no "
                         "model.architecture names its preset; the planner needs one of them")
    arch = arch.with_dtypes(cfg.get("dtype") or None, cfg.get("param_dtype") or None)
    return arch.replace(remat=cfg.remat) if cfg.get("remat") else arch


def lora_config(cfg: ConfigDict) -> Any:
    """The model block's LoraConfig, or None without adapters."""
    from models.lora import LoraConfig

    lora = cfg.get("lora")
    if not lora or not lora.get("targets"):
        return None
    try:
        return LoraConfig.parse(lora.targets, lora.rank, lora.alpha)
    except (ValueError, TypeError) as err:
        raise ValueError(f"config.model.lora: {err}") from None


def base_model_name(cfg: ConfigDict) -> str:
    """What the base weights are (recorded with LoRA adapters so they are never loaded onto another model)."""
    if cfg.get("pretrained"):
        return f"pretrained:{cfg.pretrained}"
    if cfg.get("checkpoint"):
        return f"checkpoint:{Path(cfg.checkpoint).absolute()}"
    return f"preset:{cfg.preset}:seed{cfg.init_seed}"


def load_named_tokenizer(spec: str) -> Any:
    """A tokenizer by name: "smollm2" (the bundled SmolLM2's) or an rljax checkpoint directory."""
    from models.checkpoint import load_tokenizer

    if spec == "smollm2":
        from models.pretrained import smollm2_checkpoint

        return load_tokenizer(smollm2_checkpoint())
    if not Path(spec).is_dir():
        raise ValueError(f"tokenizer {spec!r}: expected 'smollm2' or an rljax checkpoint directory")
    return load_tokenizer(spec)


def build_policy(cfg: ConfigDict, mesh: Any = None) -> tuple[Llama, Any]:
    """(model, tokenizer or None): a random preset, an rljax checkpoint, or the bundled SmolLM2, with fresh
    LoRA adapters when `cfg.lora` names targets."""
    from models.lora import add_lora

    model, tokenizer = _base_policy(cfg, mesh)
    lora = lora_config(cfg)
    if lora is not None:
        add_lora(model, lora, seed=cfg.init_seed)
    return model, tokenizer


def _base_policy(cfg: ConfigDict, mesh: Any = None) -> tuple[Llama, Any]:
    """A checkpoint is restored straight into its shards on `mesh`; `model.architecture`, where set, must
    match it."""
    from flax import nnx

    from models.checkpoint import load_checkpoint, load_tokenizer, read_config

    if cfg.get("preset"):
        arch = model_architecture(cfg)
        tokenizer = load_named_tokenizer(cfg.tokenizer) if cfg.get("tokenizer") else None
        if tokenizer is not None and tokenizer.vocab_size > arch.vocab_size:
            raise ValueError(f"config.model.tokenizer: {cfg.tokenizer!r} has {tokenizer.vocab_size} tokens, more "
                             f"than the preset's vocab_size {arch.vocab_size}; set model.overrides.vocab_size")
        return Llama(arch, rngs=nnx.Rngs(cfg.init_seed)), tokenizer
    if cfg.get("tokenizer"):
        raise ValueError("config.model.tokenizer: only for a random preset (checkpoints bring their own)")
    path = cfg.checkpoint
    if cfg.get("pretrained"):
        if cfg.pretrained != "smollm2":
            raise ValueError(f"config.model.pretrained: {cfg.pretrained!r} is not one of ['smollm2']")
        from models.pretrained import smollm2_checkpoint

        path = smollm2_checkpoint()
    if cfg.get("architecture"):
        _check_architecture(read_config(path), cfg.architecture, path)
    return (load_checkpoint(path, mesh, dtype=cfg.get("dtype") or None, param_dtype=cfg.get("param_dtype") or None,
                            remat=cfg.get("remat") or None),
            load_tokenizer(path))


def _check_architecture(found: Any, name: str, path: Any) -> None:
    expected = architecture_preset(name)
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")
    wrong = [f"{k} {getattr(found, k)} != {getattr(expected, k)}" for k in keys
             if getattr(found, k) != getattr(expected, k)]
    if wrong:
        raise ValueError(f"checkpoint {path}: not a {name} model ({', '.join(wrong)}); fix config.model.architecture")


def build_codec(config: ConfigDict, tokenizer: Any) -> Any:
    if config.codec == "digits":
        from rljax.toy import DigitCodec

        return DigitCodec()
    if tokenizer is None:
        raise ValueError("config.codec: 'chat' needs a model with a tokenizer (a checkpoint or pretrained model)")
    from rljax.dialog import ChatCodec

    return ChatCodec(tokenizer)


def load_rows(cfg: ConfigDict) -> list[dict[str, Any]]:
    """The problem rows a data block names (`max_problems` > 0 keeps the first that many)."""
    if cfg.source == "toy":
        from rljax.toy import toy_problems

        rows = toy_problems(cfg.toy_count, cfg.toy_digits)
    elif cfg.source == "bundled":
        from rljax.data import bundled_problems

        rows = bundled_problems()
    elif cfg.source in ("swerl_practice", "swerl_practice_heldout"):
        from rljax.data.bugfix_repo import shipped_instances

        rows = shipped_instances("test" if cfg.source == "swerl_practice_heldout" else "train")
    elif cfg.source in ("practice", "practice_heldout"):
        from rljax.data.practice import practice_problems

        rows = practice_problems("heldout" if cfg.source == "practice_heldout" else "train")
    elif cfg.source == "humaneval":
        from rljax.data import load_humaneval

        rows = load_humaneval(cfg.path or None)
    elif cfg.source == "code_contests":
        import logging

        from rljax.data import load_code_contests

        if not cfg.path:
            raise ValueError("config.data.path: code_contests needs the parquet shards' directory or glob")
        rows, report = load_code_contests(cfg.path, cfg.get("generated_as_private", False))
        logging.getLogger("rljax.data").info("CodeContests %s: %s", cfg.path, report.summary())
    else:
        from rljax.problems import load_jsonl

        if not cfg.path:
            raise ValueError("config.data.path: the jsonl source needs a path")
        rows = load_jsonl(cfg.path)
    limit = cfg.get("max_problems") or 0
    return rows[:limit] if limit > 0 else rows


def eval_rows(config: ConfigDict) -> list[dict[str, Any]]:
    """The eval set: `eval.source`/`eval.path` if set, else the training data; `eval.max_problems` caps it."""
    data = config.data.copy_and_resolve_references()
    if config.eval.source:
        data.source, data.path = config.eval.source, config.eval.path
    data.max_problems = config.eval.max_problems
    rows = load_rows(data)
    if not rows:
        raise ValueError(f"evaluation: the eval set ({data.source}) is empty")
    return rows


def build_env(cfg: ConfigDict, rows: list[dict[str, Any]], data_source: str = "") -> Any:
    """The environment; HumanEval rows carry their whole prompt, so their env prompt is "{description}"."""
    if cfg.name == "swerl":
        return SWERLEnv(cfg.reward_variant)
    if cfg.code_builder == "digits":
        from rljax.toy import digits_program

        builder = digits_program
    else:
        builder = extract_code
    kwargs = {"prompt": cfg.prompt} if cfg.get("prompt") else {}
    if data_source == "humaneval":
        kwargs = {"prompt": "{description}"}
    return RLEFEnv(max_turns=cfg.max_turns, rewards=RLEFRewards(**dict(cfg.rewards)), feedback_mode=cfg.feedback_mode,
                   default_limits=Limits(cfg.time_limit_s, cfg.memory_limit_mb), use_problem_limits=cfg.use_problem_limits,
                   code_extractor=builder, unrelated_problems=rows if cfg.feedback_mode == "unrelated" else (),
                   test_cache_chars=int(cfg.test_cache_mb * 2**20), **kwargs)


def loss_config(config: ConfigDict) -> LossConfig:
    a = config.algo
    return LossConfig(algorithm=a.name, temperature=config.rollout.temperature, clip_eps=a.clip_eps,
                      value_clip=a.value_clip, entropy_coef=a.entropy_coef, kl_coef=a.kl_beta,
                      kl_estimator=a.kl_estimator, kl_in_loss=a.name == "grpo" and a.kl_placement == "loss",
                      vocab_chunk=config.train.vocab_chunk, clip_eps_high=a.get("clip_eps_high") or None,
                      dual_clip=a.get("dual_clip", 0.0), ratio_level=a.get("ratio_level", "token"),
                      tis_cap=a.get("tis_cap", 0.0))


def optim_config(cfg: ConfigDict) -> OptimConfig:
    return OptimConfig(**dict(cfg))
