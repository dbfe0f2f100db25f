"""Translate with an exported ONNX folder, without torch: `python scripts/translate_onnx.py FOLDER "text" ...`.

The same command as `vt-translate-onnx` and `python -m vanilla_transformer_ort` (`vanilla_transformer_ort.cli`).
"""

from vanilla_transformer_ort.cli import main

if __name__ == "__main__":
    main()
