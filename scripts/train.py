"""vt-train as a file, for `accelerate launch scripts/train.py ...` (DDP, FSDP, DeepSpeed; docs/training.md)."""

from vanilla_transformer.cli import train_main

if __name__ == "__main__":
    raise SystemExit(train_main())
