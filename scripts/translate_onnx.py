"""Translate with an exported ONNX folder, without torch: `python scripts/translate_onnx.py FOLDER "text" ...`."""

from vanilla_transformer_ort.__main__ import main

if __name__ == "__main__":
    main()
