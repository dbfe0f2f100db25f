"""Translate a file (one sentence per line) or stdin with a trained model.

    echo "File not found." | python scripts/translate.py --model out/model

Installed as `vt-translate`; the logic lives in `vanilla_transformer.cli.translate_command`.
"""

from vanilla_transformer.cli import translate_command as main

if __name__ == "__main__":
    main()
