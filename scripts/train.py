"""Train a vanilla Transformer for translation with the paper's recipe (§5) on Seq2SeqTrainer.

    python scripts/train.py --tokenizer_name out/tokenizer --output_dir out/model --preset small \\
        --do_train --predict_with_generate --max_steps 2000
    accelerate launch scripts/train.py ...   # DDP, FSDP, DeepSpeed (docs/TRAINING.md)

Installed as `vt-train`; the logic lives in `vanilla_transformer.cli.train_command`.
"""

from vanilla_transformer.cli import train_command as main

if __name__ == "__main__":
    main()
