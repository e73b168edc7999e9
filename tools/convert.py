#!/usr/bin/env python3
"""Thin wrapper: `convert.py ARGS` is `rljax convert ARGS` (HF safetensors / GGUF <-> rljax checkpoint)."""
import sys

from rljax.cli import main

if __name__ == "__main__":
    sys.exit(main(["convert", *sys.argv[1:]]))
