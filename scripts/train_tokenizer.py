"""Train the joint source+target BPE tokenizer (paper §5.1).

    python scripts/train_tokenizer.py --output_dir out/tokenizer --vocab_size 8000

Installed as `vt-train-tokenizer`; the logic lives in `vanilla_transformer.cli.train_tokenizer_command`.
"""

from vanilla_transformer.cli import train_tokenizer_command as main

if __name__ == "__main__":
    main()
