"""Average the last N checkpoints of a training run into a loadable model folder (paper §6.1).

    python scripts/average_checkpoints.py --run_dir out/model --num_checkpoints 5 --output_dir out/model-avg5

Installed as `vt-average-checkpoints`; the logic lives in `vanilla_transformer.cli.average_checkpoints_command`.
"""

from vanilla_transformer.cli import average_checkpoints_command as main

if __name__ == "__main__":
    main()
