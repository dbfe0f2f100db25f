"""Train a vanilla Transformer for translation with the paper's recipe (§5) on Seq2SeqTrainer.

    python scripts/train.py --tokenizer_name out/tokenizer --output_dir out/model --preset small \\
        --do_train --predict_with_generate --max_steps 2000
    accelerate launch scripts/train.py ...   # DDP, FSDP, DeepSpeed (docs/TRAINING.md)

Installed as `vt-train`; the logic lives in `vanilla_transformer.cli`. `main` is `train_command`, which returns what it
made (for Python callers); run as a script, `train_main` reports a user error as one line on stderr and exit status 2.
"""

import sys

from vanilla_transformer.cli import train_command as main
from vanilla_transformer.cli import train_main

__all__ = ["main"]  # the command, for Python callers and tests

if __name__ == "__main__":
    sys.exit(train_main())
