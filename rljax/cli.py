"""The `rljax` command: convert, generate, demo (later issues add train, eval, mine, plot)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


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
    from models.checkpoint import load_checkpoint, load_tokenizer
    from models.generate import greedy_generate

    model = load_checkpoint(args.checkpoint)
    tokenizer = load_tokenizer(args.checkpoint)
    if args.raw or tokenizer.chat_template is None:
        ids = tokenizer.encode(args.prompt)
    else:
        ids, _ = tokenizer.encode_dialog([{"role": "user", "content": args.prompt}], add_generation_prompt=True)
    new = greedy_generate(model, ids, args.max_new_tokens, stop_ids=tokenizer.eos_ids)
    print(tokenizer.decode(new, skip_special=True))
    return 0


DEMO_PROMPTS = (
    "Write a Python function that returns the sum of a list.",
    "Write a Python program that reads two integers from stdin and prints their product.",
)


def _demo(args: argparse.Namespace) -> int:
    from models.checkpoint import load_checkpoint, load_tokenizer
    from models.generate import greedy_generate
    from models.pretrained import smollm2_checkpoint

    ckpt = smollm2_checkpoint(args.cache_dir)
    print(f"SmolLM2-135M-Instruct checkpoint: {ckpt}")
    model, tokenizer = load_checkpoint(ckpt), load_tokenizer(ckpt)
    for prompt in DEMO_PROMPTS:
        ids, _ = tokenizer.encode_dialog([{"role": "user", "content": prompt}], add_generation_prompt=True)
        new = greedy_generate(model, ids, args.max_new_tokens, stop_ids=tokenizer.eos_ids)
        print(f"\n>>> {prompt}\n{tokenizer.decode(new, skip_special=True)}")
    return 0


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
    gen = sub.add_parser("generate", help="greedy completion from a checkpoint")
    gen.add_argument("--checkpoint", required=True)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--raw", action="store_true", help="no chat template: continue the prompt text")
    gen.set_defaults(func=_generate)
    demo = sub.add_parser("demo", help="the embedded default job on SmolLM2-135M-Instruct (no download)")
    demo.add_argument("--cache-dir", default=None)
    demo.add_argument("--max-new-tokens", type=int, default=96)
    demo.set_defaults(func=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from models.checkpoint import CheckpointError
    from models.config import ConfigError
    from models.convert import WeightsError
    from models.tokenizer import TokenizerError

    try:
        return args.func(args)
    except (CheckpointError, ConfigError, WeightsError, TokenizerError, FileNotFoundError, ValueError) as err:
        print(f"rljax {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
