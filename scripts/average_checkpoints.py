"""Average the last N checkpoints of a training run into a loadable model folder (paper §6.1: 5 for base, 20 for big).

python scripts/average_checkpoints.py --run_dir out/model --num_checkpoints 5 --output_dir out/model-avg5
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from vanilla_transformer.training.averaging import average_checkpoints, last_checkpoints


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run_dir", required=True, help="A scripts/train.py --output_dir with checkpoint-* folders.")
    parser.add_argument("--num_checkpoints", type=int, default=5)
    parser.add_argument("--output_dir", required=True)
    args = parser.parse_args(argv)
    checkpoints = last_checkpoints(args.run_dir, args.num_checkpoints)
    output = average_checkpoints(checkpoints, args.output_dir)
    print(f"Averaged {', '.join(c.name for c in checkpoints)} into {output}")
    return output


if __name__ == "__main__":
    main()
