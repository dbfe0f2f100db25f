"""Export: ONNX graphs, their fp16/int8 variants and helper graphs, folder assembly, validation (a separate last step),
and the CTranslate2 converter. The file names and graph I/O come from `vanilla_transformer_ort.contract`."""

# CTranslate2's weight types that `vt-export-ctranslate2 --quantization` offers; here rather than in
# ctranslate2_export.py, which needs the ctranslate2 package, so that `--help` lists them without it.
CTRANSLATE2_QUANTIZATIONS = ("int8", "int8_float32", "float16")
