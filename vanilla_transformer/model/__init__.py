"""The model (§3): the files that `save_pretrained` ships as remote code, and nothing else.

Reading order: configuration → embeddings (§3.4, §3.5) → attention (§3.2) → layers (§3.1, §3.3) → stacks (the encoder
and decoder, §3.1) → modeling (the encoder-decoder and the head with its loss). `kernels.py` holds the speed paths the
others call through one seam (with the chunked loss math of `loss.py`), `input_checks.py` the input validation, and
`pipeline_vanilla_transformer.py` the translation pipeline shipped with Hub checkpoints.
"""
