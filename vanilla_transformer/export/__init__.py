"""Export: ONNX graphs, their fp16/int8 variants and helper graphs, folder assembly, validation (a separate last step),
and the CTranslate2 converter. The file names and graph I/O come from `vanilla_transformer_ort.contract`."""
