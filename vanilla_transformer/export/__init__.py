"""Export: `onnx/` (the ONNX exporter, both layouts), `ctranslate2_export` (CTranslate2's own converter API),
`output_folder` (the staged output folder every exporter writes), and `cli` (vt-export-onnx, vt-export-ctranslate2)."""

# CTranslate2's weight types that `vt-export-ctranslate2 --quantization` offers; here rather than in
# ctranslate2_export.py, which needs the ctranslate2 package, so that `--help` lists them without it.
CTRANSLATE2_QUANTIZATIONS = ("int8", "int8_float32", "float16")
