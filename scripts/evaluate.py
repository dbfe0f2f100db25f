"""sacreBLEU and chrF of a model folder on a test file, beam 4 by default.

    python scripts/evaluate.py --model out/model --test_file ../shared/data/gettext-en-de/test.tsv

Installed as `vt-evaluate`; the logic lives in `vanilla_transformer.cli.evaluate_command`.
"""

from vanilla_transformer.cli import evaluate_command as main

if __name__ == "__main__":
    main()
