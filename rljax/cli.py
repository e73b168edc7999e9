"""The `rljax` command: convert, generate, train, eval, export, plan, plot, demo (and mine)."""
from __future__ import annotations

import argparse
import json
import re
import sys
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from ml_collections import ConfigDict


def _convert(args: argparse.Namespace) -> int:
    from models import checkpoint
    from models.config import LlamaConfig
    from models.convert import param_count

    if args.dry_run:
        cfg = LlamaConfig.preset(args.preset) if args.preset else None
        if cfg is None:
            from models.convert import read_hf_config

            cfg = read_hf_config(args.from_hf) if args.from_hf else checkpoint.read_config(args.to_hf)
        print(json.dumps(size_report(cfg, param_count(cfg))))
        return 0
    sources = [s for s in (args.from_hf, args.from_gguf, args.to_hf) if s]
    if len(sources) != 1 or not args.out:
        print("rljax convert: give exactly one of --from-hf DIR, --from-gguf FILE, --to-hf CKPT, and --out",
              file=sys.stderr)
        return 2
    if args.from_hf:
        out = checkpoint.convert_hf_to_checkpoint(args.from_hf, args.out)
    elif args.from_gguf:
        out = checkpoint.convert_gguf_to_checkpoint(args.from_gguf, args.out)
    else:
        checkpoint.convert_checkpoint_to_hf(args.to_hf, args.out)
        out = args.out
    print(f"wrote {out}")
    return 0


def size_report(cfg: "LlamaConfig", params: int) -> dict[str, float]:
    """Parameter count and the memory of weights, AdamW state (fp32 m, v) and fp32 gradients, in GiB."""
    width = {"float32": 4, "bfloat16": 2, "float16": 2}[cfg.param_dtype]
    gib = 2.0**30
    return {"params": params, "params_billion": round(params / 1e9, 4), "param_dtype": cfg.param_dtype,
            "weights_gib": round(params * width / gib, 3), "adamw_state_gib": round(params * 8 / gib, 3),
            "grads_fp32_gib": round(params * 4 / gib, 3)}


def _generate(args: argparse.Namespace) -> int:
    import jax

    from models.checkpoint import load_checkpoint, load_tokenizer
    from models.sampler import Sampler, SamplingParams

    model = load_checkpoint(args.checkpoint)
    tokenizer = load_tokenizer(args.checkpoint)
    if args.raw or tokenizer.chat_template is None:
        ids = tokenizer.encode(args.prompt)
    else:
        ids, _ = tokenizer.encode_dialog([{"role": "user", "content": args.prompt}], add_generation_prompt=True)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k, stop_ids=tuple(tokenizer.eos_ids))
    sampler = Sampler(model, tokenizer, pad_id=tokenizer.pad_id)
    completions, _ = sampler.generate([ids] * args.num_samples, sampling, jax.random.key(args.seed))
    for i, completion in enumerate(completions):
        if args.num_samples > 1:
            print(f"--- sample {i} ({completion.finish_reason}, {len(completion.token_ids)} tokens)")
        print(completion.text)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from rljax.demo import format_summary, run_demo

    _log_to_console()
    workdir = args.workdir or ("runs/demo" if args.task == "rlef" else f"runs/demo_{args.task}")
    summary = run_demo(workdir, args.steps, args.eval_problems, progress=not args.quiet,
                       max_new_tokens=args.max_new_tokens, dialogs_per_step=args.dialogs_per_step,
                       eval_samples=args.eval_samples, task=args.task, warmup_steps=args.warmup_steps)
    print(format_summary(summary))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from rljax.plots import plot_run

    for path in plot_run(args.workdir, args.out):
        print(f"wrote {path}")
    return 0


def _mine(args: argparse.Namespace) -> int:
    from rljax.data.mine import MineOptions, mine_repository, split_by_date, write_instances

    if bool(args.split_date) != bool(args.test_out):
        raise ValueError("rljax mine: --split-date and --test-out go together (instances on or after the date go "
                         "to --test-out)")
    if args.max_prompt_tokens and not args.tokenizer:
        raise ValueError("rljax mine: --max-prompt-tokens needs --tokenizer (smollm2 or a checkpoint directory)")
    options = MineOptions(args.max_files, args.max_diff_lines, args.context_files, not args.all_changes,
                          args.context_pick, args.max_prompt_tokens)
    counter = None
    if args.max_prompt_tokens:
        from rljax.dialog import ChatCodec
        from rljax.envs.swerl import prompt_token_counter
        from rljax.run_config import load_named_tokenizer

        counter = prompt_token_counter(ChatCodec(load_named_tokenizer(args.tokenizer)))
    instances, report = mine_repository(args.repo, options, counter)
    if args.split_date:
        train, test = split_by_date(instances, args.split_date)
        paths = [write_instances(train, args.out), write_instances(test, args.test_out)]
        print(f"{report.summary()}; wrote {len(train)} before {args.split_date} to {paths[0]} and {len(test)} "
              f"from then on to {paths[1]}")
    else:
        print(f"{report.summary()}; wrote {write_instances(instances, args.out)}")
    return 0


def _log_to_console() -> None:
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    for name in ("rljax", "executor"):
        logging.getLogger(name).addHandler(handler)
        logging.getLogger(name).setLevel(logging.INFO)
        logging.getLogger(name).propagate = False  # a library may have given the root logger a handler too


def parse_run_config(argv: Sequence[str]) -> "ConfigDict":
    """`--config FILE [--config.key=value ...]` (ml_collections config_flags) -> the run config."""
    from absl import flags
    from ml_collections import config_flags

    values = flags.FlagValues()
    args = ["rljax"] + list(argv)
    config_flags.DEFINE_config_file("config", None, "run config file (configs/NAME.py)", flag_values=values,
                                    sys_argv=args)  # the overrides are found in these args, not sys.argv
    try:
        values(args)
        config = values.config
        if config is not None:
            config.to_dict()  # config_flags loads lazily: surface a broken file here
    except KeyError as err:
        raise ValueError(f"bad config flags: the config has no key {err.args[0]!r}") from None
    except Exception as err:  # a config file that fails to load or an override that does not apply
        lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
        detail = lines[-1] if lines and "Errno" in lines[-1] else (lines[0] if lines else type(err).__name__)
        missing = re.fullmatch(r"\"?'([^']+)'\"?", detail)
        if missing:
            detail = f"the config has no key {missing.group(1)!r}"
        raise ValueError(f"bad config flags: {detail}") from None
    if config is None:
        raise ValueError("give a run config: rljax train --config configs/NAME.py [--config.key=value ...]")
    return config


def _train(argv: Sequence[str]) -> int:
    from rljax.trainer import train

    _log_to_console()
    config = parse_run_config(argv)
    history = train(config)
    if history:
        last = history[-1]
        print(f"step {last['step']}: reward/mean {last['reward/mean']:+.3f}, solve_rate/final "
              f"{last['solve_rate/final']:.3f}; metrics in {config.workdir}/metrics.jsonl")
    return 0


def _eval(argv: Sequence[str]) -> int:
    """Evaluate the run's policy (the workdir's latest checkpoint, else the config's model) on the eval set."""
    from pathlib import Path

    from rljax.evaluation import Evaluator, format_table, write_report
    from rljax.plots import EVAL_DIR
    from rljax.trainer import Trainer

    _log_to_console()
    config = parse_run_config(argv)
    config.checkpoint.resume = "auto"
    trainer = Trainer(config)
    try:
        evaluator = Evaluator(config, trainer.learner.policy_model(), trainer.tokenizer, trainer.mesh)
        try:
            report = evaluator.run(progress=config.log.progress)
        finally:
            evaluator.close()
    finally:
        trainer.close()
    report["step"] = trainer.step_count
    path = write_report(report, Path(config.workdir) / EVAL_DIR / f"step{trainer.step_count:04d}_eval.json")
    print(format_table(report))
    print(f"wrote {path}")
    return 0


def _plan(argv: Sequence[str]) -> int:
    """Per-device memory of a run config on a topology; exit status 2 when it does not fit."""
    from pathlib import Path

    from rljax.plan import format_plan, parse_topology, plan_memory, planned_update, xla_update_memory

    parser = argparse.ArgumentParser(prog="rljax plan")
    parser.add_argument("--topology", default="", help="v5p-128, v4-64, v5e-256, v6e-64, h100-8, ...")
    parser.add_argument("--devices", type=int, default=0, help="instead of --topology: the device count")
    parser.add_argument("--hbm-gib", type=float, default=0.0, help="with --devices: memory per device in GiB")
    parser.add_argument("--prefill-tokens", type=int, default=0,
                        help="new tokens per prefill (default: min(cache - max_new_tokens, 2048))")
    parser.add_argument("--xla", action="store_true",
                        help="also compile the update step here and print XLA's memory analysis next to the plan")
    parser.add_argument("--tpu-compile", action="store_true",
                        help="compile the run's programs with the TPU compiler for --topology (needs libtpu: pip "
                             "install -e '.[tpu-compile]'; no TPU needed) and set its figures beside the plan")
    args, rest = parser.parse_known_args(argv)
    config = parse_run_config(rest)
    plan = plan_memory(config, parse_topology(args.topology, args.devices, args.hbm_gib), args.prefill_tokens)
    print(format_plan(plan, Path(config.workdir).name))
    if args.tpu_compile:
        from rljax.tpu_compile import compile_report, format_report

        report = compile_report(config, args.topology)
        print(format_report(report))
        return 0 if report.fits else 2
    if args.xla:
        one_device = plan_memory(config, parse_topology(devices=1, hbm_gib=plan.topology.hbm_bytes / 2**30))
        measured, planned = xla_update_memory(config), planned_update(one_device)
        for key, value in planned.items():
            print(f"  update {key}: planned (1 device) {value / 2**20:.1f} MiB, XLA {measured[key] / 2**20:.1f} MiB, "
                  f"ratio {value / max(measured[key], 1):.2f}")
    return 0 if plan.fits else 2


def _export(argv: Sequence[str]) -> int:
    """A run's trained policy (the workdir's latest checkpoint; LoRA adapters merged into the weights) as an
    rljax model checkpoint, or with --hf as a transformers directory."""
    from models.checkpoint import export_model
    from rljax.trainer import Trainer

    parser = argparse.ArgumentParser(prog="rljax export")
    parser.add_argument("--out", required=True, help="a new directory")
    parser.add_argument("--hf", action="store_true", help="write transformers' format (config.json, safetensors)")
    args, rest = parser.parse_known_args(argv)
    config = parse_run_config(rest)
    config.checkpoint.resume = "require"
    config.log.tensorboard = False
    trainer = Trainer(config)
    try:
        path = export_model(trainer.learner.policy_model(), args.out, trainer.tokenizer, hf=args.hf)
    finally:
        trainer.close()
    print(f"wrote the step-{trainer.step_count} policy of {config.workdir} to {path}")
    return 0


CONFIG_COMMANDS = {"train": _train, "eval": _eval, "plan": _plan, "export": _export}  # their flags belong to ml_collections' config_flags


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rljax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("convert", help="HF safetensors / GGUF <-> rljax orbax checkpoint")
    conv.add_argument("--from-hf", metavar="HF_DIR")
    conv.add_argument("--from-gguf", metavar="FILE")
    conv.add_argument("--to-hf", metavar="CKPT")
    conv.add_argument("--out")
    conv.add_argument("--dry-run", action="store_true", help="print parameter count and memory, write nothing")
    conv.add_argument("--preset", help="with --dry-run: a models.config preset name")
    conv.set_defaults(func=_convert)
    gen = sub.add_parser("generate", help="complete a prompt from a checkpoint (greedy unless --temperature > 0)")
    gen.add_argument("--checkpoint", required=True)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--num-samples", type=int, default=1)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--raw", action="store_true", help="no chat template: continue the prompt text")
    gen.set_defaults(func=_generate)
    sub.add_parser("train", help="train: rljax train --config configs/NAME.py [--config.key=value ...]")
    sub.add_parser("eval", help="evaluate a run's policy (n@k, 95%% CIs): rljax eval --config configs/NAME.py "
                                "[--config.eval.key=value ...]")
    sub.add_parser("plan", help="per-device memory of a run on a pod slice: rljax plan --config configs/NAME.py "
                                "--topology v5p-128 [--xla]")
    sub.add_parser("export", help="a run's trained policy (LoRA merged) as a checkpoint: rljax export --config "
                                  "configs/NAME.py --out DIR [--hf]")
    plot = sub.add_parser("plot", help="PNG plots of a run's metrics and evaluations")
    plot.add_argument("workdir")
    plot.add_argument("--out", default=None, help="directory for the PNGs (default WORKDIR/plots)")
    plot.set_defaults(func=_plot)
    mine = sub.add_parser("mine", help="SWE-RL instances from a local git repository's history")
    mine.add_argument("--repo", required=True)
    mine.add_argument("--out", required=True, help="output JSON lines (rows for SWERLEnv)")
    mine.add_argument("--max-files", type=int, default=5, help="skip changes touching more files")
    mine.add_argument("--max-diff-lines", type=int, default=500, help="skip changes with more added+deleted lines")
    mine.add_argument("--context-files", type=int, default=2, help="unchanged files added to each instance")
    mine.add_argument("--context-pick", choices=("imports", "directory"), default="imports",
                      help="imports: modules the changed files import first, then their directories' files; "
                           "directory: only the directories' files (by name)")
    mine.add_argument("--all-changes", action="store_true", help="keep changes that do not say they fix something")
    mine.add_argument("--max-prompt-tokens", type=int, default=0,
                      help="skip instances whose prompt (chat template included) is longer; context files are "
                           "added only while it fits")
    mine.add_argument("--tokenizer", default="", help="with --max-prompt-tokens: smollm2 or a checkpoint directory")
    mine.add_argument("--split-date", default="", help="ISO date: instances from then on go to --test-out")
    mine.add_argument("--test-out", default="", help="with --split-date: the held-out instances' JSON lines")
    mine.set_defaults(func=_mine)
    from rljax.demo import TASKS

    demo = sub.add_parser("demo", help="SmolLM2-135M-Instruct learns on this machine: evaluate on held-out problems, "
                                       "train, evaluate, plot (no download); --task rlef (stdin/stdout problems, "
                                       "the default) or swerl (issues of a small library)")
    demo.add_argument("--task", choices=sorted(TASKS), default="rlef")
    demo.add_argument("--workdir", default="")
    demo.add_argument("--steps", type=int, default=None, help="training steps (default: the task's, " + ", ".join(
        f"{k} {t.steps}" for k, t in TASKS.items()) + ")")
    demo.add_argument("--eval-problems", type=int, default=None,
                      help="held-out problems (0: all; default: the task's, " + ", ".join(
                          f"{k} {t.eval_problems}" for k, t in TASKS.items()) + ")")
    demo.add_argument("--eval-samples", type=int, default=0,
                      help="dialogs per held-out problem (default: the config's)")
    demo.add_argument("--max-new-tokens", type=int, default=0, help="answer length cap (default: the config's)")
    demo.add_argument("--dialogs-per-step", type=int, default=0,
                      help="answers per step, in groups of up to G (default: the config's problems x G)")
    demo.add_argument("--warmup-steps", type=int, default=None,
                      help="supervised warm-up steps before RL (0: none; default: the config's)")
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in CONFIG_COMMANDS:
        return _run(argv[0], lambda: CONFIG_COMMANDS[argv[0]](argv[1:]))
    args = build_parser().parse_args(argv)
    return _run(args.command, lambda: args.func(args))


# the commands that compile a model's programs on this host (plan's TPU programs bypass the cache)
COMPILING_COMMANDS = frozenset({"train", "eval", "demo", "generate", "export"})


def use_compilation_cache(command: str) -> None:
    """Keep `command`'s compiled XLA programs in `$RLJAX_CACHE/xla` (JAX's persistent compilation cache), so
    a rerun of the same model, shapes and mesh loads them instead of compiling again. JAX_COMPILATION_CACHE_DIR,
    when set, is left to JAX (another folder; empty: no cache); JAX's own threshold applies (programs that took
    at least `jax_persistent_cache_min_compile_time_secs`, 1 s by default, to compile)."""
    import os

    if command not in COMPILING_COMMANDS or "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    import jax

    from models.pretrained import DEFAULT_CACHE

    jax.config.update("jax_compilation_cache_dir", str(DEFAULT_CACHE / "xla"))


def _run(command: str, job: "Callable[[], int]") -> int:
    """Run a subcommand; a bad input becomes one error line and exit status 1."""
    use_compilation_cache(command)
    from models.checkpoint import CheckpointError
    from models.config import ConfigError
    from models.convert import WeightsError
    from models.tokenizer import TokenizerError
    from rljax.host_memory import retain_freed_host_memory

    try:
        retain_freed_host_memory()
        return job()
    except (CheckpointError, ConfigError, WeightsError, TokenizerError, FileNotFoundError, ValueError) as err:
        print(f"rljax {command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
