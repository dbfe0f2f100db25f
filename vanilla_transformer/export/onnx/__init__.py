"""The ONNX exporter. Reading order: `graphs` (the encoder and the one-step decoder, traced) → `inplace_decoder` (the
decoder step that writes its cache in place, built node by node) → `variants` (fp16, int8) → `helper_graphs` (beam
ranking and cache reordering) → `weights` (external data, the shared embedding stored once) → `export` (the folder)
→ `validation` (a separate last step); `merged_decoder` and `standard_layout` write the standard layout that Optimum
and transformers.js read. File names and graph I/O come from `vanilla_transformer_ort.contract`.
"""
