"""The model (§3): the files that `save_pretrained` ships as remote code, and nothing else.

Reading order: configuration → embeddings (§3.4, §3.5) → attention (§3.2) → layers (§3.1, §3.3) → modeling (stacks,
encoder-decoder, head); `kernels.py` holds the CPU speed paths the others call through one seam.
"""
