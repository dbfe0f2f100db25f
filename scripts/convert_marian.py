"""Convert a MarianMT / OPUS-MT checkpoint into a vanilla-transformer model folder, exactly.

    python scripts/convert_marian.py --model Helsinki-NLP/opus-mt-en-de --output out/opus-mt-en-de

Installed as `vt-convert-marian`; the logic lives in `vanilla_transformer.cli.convert_marian_command`.
"""

from vanilla_transformer.cli import convert_marian_command as main

if __name__ == "__main__":
    main()
