"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Field names follow transformers' Marian/BART family so that tooling which reads those configs (generation,
ONNX exporters, model cards, Accelerate's device maps) reads this one too. This file imports only the standard
library and transformers (plus huggingface_hub, which transformers depends on) so that it can be shipped as remote
code next to a checkpoint.
"""

import dataclasses
import difflib
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import GenerationConfig, PreTrainedConfig

# Paper Table 3. "base" and "big" are the paper's rows (EN-DE; big uses P_drop 0.3); the small presets keep the
# architecture and shrink it for CPU demos and tests.
PRESETS: dict[str, dict[str, Any]] = {
    "base": dict(
        d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=2048, decoder_ffn_dim=2048, dropout=0.1,
    ),
    "big": dict(
        d_model=1024, encoder_layers=6, decoder_layers=6, encoder_attention_heads=16, decoder_attention_heads=16,
        encoder_ffn_dim=4096, decoder_ffn_dim=4096, dropout=0.3,
    ),
    "small": dict(
        d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=1024, decoder_ffn_dim=1024, dropout=0.1,
    ),
    "tiny": dict(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=256, decoder_ffn_dim=256, dropout=0.1,
    ),
}  # fmt: skip

ACTIVATIONS = ("relu", "gelu", "silu", "swish")
# Fields a saved config.json must state: the weights were saved with these sizes, so a default would not fit them.
SIZE_FIELDS = (
    "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_ffn_dim", "decoder_ffn_dim",
)  # fmt: skip
# Keyword arguments PreTrainedConfig consumes without a field of the same name.
GENERIC_CONFIG_KWARGS = (
    "torch_dtype", "num_labels", "name_or_path", "attn_implementation", "experts_implementation",
    "output_attentions", "per_layer_config", "_commit_hash",
)  # fmt: skip


@strict
class VanillaTransformerConfig(PreTrainedConfig):
    r"""Hyper-parameters of the encoder-decoder Transformer; the defaults are the paper's base model (Table 3).

    Field → paper symbol:

    - `vocab_size`: size of the shared source/target vocabulary (§5.1: ~37,000 BPE tokens for EN-DE); with
      `share_encoder_decoder_embeddings=False`, the size of the source vocabulary.
    - `d_model`: d_model, the width of every sub-layer output and embedding (§3.1; 512 base, 1024 big).
    - `encoder_layers`, `decoder_layers`: N, the number of identical layers per stack (§3.1; 6).
    - `encoder_attention_heads`, `decoder_attention_heads`: h, the number of heads (§3.2.2; 8 base, 16 big);
      d_k = d_v = d_model / h.
    - `encoder_ffn_dim`, `decoder_ffn_dim`: d_ff, the inner width of the position-wise FFN (§3.3; 2048 / 4096).
    - `dropout`: P_drop, applied to each sub-layer output before the residual add and to the sums of embeddings and
      positional encodings (§5.4; 0.1 base, 0.3 big).
    - `attention_dropout`: dropout on the attention probabilities. Not in the paper: 0 by default.
    - `activation_dropout`: dropout after the FFN's ReLU. Not in the paper: 0 by default.
    - `activation_function`: the FFN non-linearity; the paper's is ReLU, max(0, x) (§3.3).
    - `max_position_embeddings`: the length the model is meant for. Positions have no hard limit: the sinusoid of
      §3.5 is computed in closed form for any position; this field only informs tokenizers and exporters.
    - `scale_embedding`: multiply embeddings by √d_model (§3.4); True in the paper.
    - `layer_norm_eps`: ε of LayerNorm (Ba et al., 2016), used by every residual block (§3.1).
    - `tie_word_embeddings`: share one matrix between the source embedding, the target embedding and the pre-softmax
      projection (§3.4); True in the paper.
    - `normalize_before`: False (the paper's post-LN, `LayerNorm(x + Dropout(Sublayer(x)))`); True switches to pre-LN,
      `x + Dropout(Sublayer(LayerNorm(x)))` with a final LayerNorm per stack, a documented deviation that trains more
      stably for deep stacks or fp16.
    - `init_std`: standard deviation of the N(0, init_std²) initialisation of every projection and embedding (0.02,
      as in transformers' Marian/BART; the paper does not state its initialisation). None selects fairseq's scheme,
      Xavier-uniform projections and N(0, d_model^-1) embeddings, which trains worse with a tied output projection
      under short warmups (docs/training.md).
    - `pad_token_id`, `bos_token_id`, `eos_token_id`, `decoder_start_token_id`: special token ids shared with the
      tokenizer (`<pad>`=0, `<s>`=1, `</s>`=2 by default; the decoder starts from `<s>`).
    - `use_cache`: keep the decoder's keys/values between generation steps.
    - `cpu_weight_packing`: in CPU fp32 inference without autograd (as in `generate()`), run the decoder's and the
      output projection's matrix products with weights packed once by oneDNN (`kernels.Linear`): 1.2-2.2x faster
      decoding at base size, for a second copy of those weights in memory (on Intel CPUs, inputs of 1-3 rows keep
      torch's own `linear`, faster there: `kernels.PACKED_MIN_ROWS`). An engineering switch, not in the paper;
      `model.set_cpu_weight_packing(False)` turns it off.
    - `fused_output_loss`: in eager CPU fp32 training (the model in `train()` mode, `labels` given, no autocast, no
      graph capture), compute the output projection and the loss together in row chunks (`loss.LinearCrossEntropy`),
      never holding the (tokens, vocab) logits or their gradient; the loss and gradients are the unfused ones to fp32
      rounding, but `outputs.logits` is None on that path (as with Liger-Kernel's fused linear cross-entropy), and
      `lm_head`'s forward is not called, so the path is skipped wherever `lm_head` carries forward hooks (FSDP, PEFT)
      or is not this package's plain `Linear`. An engineering switch, not in the paper; False always returns logits.

    Opt-in fields for importing MarianMT / OPUS-MT checkpoints (see `convert.py`); the defaults are the paper's model:

    - `add_final_logits_bias`: add a trained bias vector, the buffer `final_logits_bias` of shape (1, target vocab), to
      the logits, as Marian does. Not in the paper (its pre-softmax projection is the bare embedding matrix, §3.4):
      False by default.
    - `share_encoder_decoder_embeddings`: one embedding matrix (`model.shared`) for source and target tokens, as in
      the paper (§3.4, a joint vocabulary). False gives the encoder and the decoder embedding matrices of their own
      (`model.encoder.embed_tokens`, `model.decoder.embed_tokens`, Marian's layout for separate vocabularies); with
      `tie_word_embeddings` the pre-softmax projection then shares the decoder's matrix.
    - `decoder_vocab_size`: size of the target vocabulary. None (the default) means `vocab_size` and is stored as
      `vocab_size`, as `MarianConfig` does (transformers reads `decoder_*` fields as the decoder's). The paper uses one
      joint vocabulary, so it must equal `vocab_size` while the embeddings are shared.

    Use `VanillaTransformerConfig.from_preset("base" | "big" | "small" | "tiny", **overrides)` for Table 3's rows.
    """

    model_type = "vanilla_transformer"
    keys_to_ignore_at_inference = ["cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    activation_function: str = "relu"
    max_position_embeddings: int = 1024
    scale_embedding: bool = True
    layer_norm_eps: float = 1e-5
    normalize_before: bool = False
    init_std: float | None = 0.02
    tie_word_embeddings: bool = True
    is_encoder_decoder: bool = True
    use_cache: bool = True
    cpu_weight_packing: bool = True
    fused_output_loss: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1
    add_final_logits_bias: bool = False
    share_encoder_decoder_embeddings: bool = True
    decoder_vocab_size: int | None = None

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "VanillaTransformerConfig":
        """The config of a named preset: `"base"` and `"big"` are the paper's Table 3 rows; `"small"` and `"tiny"`
        are reduced versions for CPU demos and tests. Keyword arguments override any field; an unknown name is a
        `ValueError` (a typo such as `dropuot=0.3` would otherwise be stored and ignored)."""
        if not isinstance(name, str) or name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; allowed presets: {', '.join(sorted(PRESETS))}.")
        cls.check_field_names(overrides)
        return cls(**{**PRESETS[name], **overrides})

    @classmethod
    def check_field_names(cls, names: Any, source: str = "config field") -> None:
        """Raise a `ValueError` for names that are neither fields of this config nor keyword arguments a default
        `PreTrainedConfig` understands (`attn_implementation`, `dtype`, `*_token_id`, generation settings, ...),
        suggesting the closest field."""
        fields = [f.name for f in dataclasses.fields(cls)] + list(cls.attribute_map)
        known = set(fields) | set(GENERIC_CONFIG_KWARGS) | set(GenerationConfig._get_default_generation_params())
        known |= {n for n in dir(PreTrainedConfig) if not n.startswith("__")}
        # Any special token id (sep/cls/mask/unk_token_id) is accepted: tokenizers and tooling set them generically.
        unknown = [n for n in names if n not in known and not str(n).endswith("_token_id")]
        if unknown:
            hints = []
            for n in unknown:
                close = difflib.get_close_matches(n, fields, n=1)
                hints.append(f"{n!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ValueError(
                f"Unknown {source}{'s' if len(unknown) > 1 else ''} {', '.join(hints)} for {cls.__name__}; "
                f"fields are: {', '.join(sorted(set(fields)))}."
            )

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> "VanillaTransformerConfig":
        """As `PreTrainedConfig.from_dict`; a saved config (one with a `model_type`) must state every size field,
        since the weights were saved with those sizes and the defaults would not fit them."""
        if "model_type" in config_dict:
            missing = [name for name in SIZE_FIELDS if name not in config_dict and name not in kwargs]
            if missing:
                raise ValueError(
                    f"The saved config (config.json) lacks {', '.join(f'`{n}`' for n in missing)}: a "
                    f"{cls.__name__} must state its sizes, which the saved weights were built with. Add the "
                    f"missing key{'s' if len(missing) > 1 else ''} to config.json (e.g. `vocab_size` = the "
                    "tokenizer's length)."
                )
        return super().from_dict(config_dict, **kwargs)

    @property
    def target_vocab_size(self) -> int:
        """Size of the decoder's vocabulary: `decoder_vocab_size` when the embeddings are not shared, else
        `vocab_size`."""
        if self.share_encoder_decoder_embeddings or self.decoder_vocab_size is None:
            return self.vocab_size
        return self.decoder_vocab_size

    def __post_init__(self, **kwargs: Any) -> None:
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        self._check_values()
        super().__post_init__(**kwargs)

    def _check_values(self) -> None:
        """Reject values the model cannot be built with, with a `ValueError` naming the field and what is allowed."""
        for field in (
            "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
            "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings",
        ):  # fmt: skip
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{field}` must be a positive integer, got {value!r}.")
        if self.d_model % 2 != 0:
            raise ValueError(f"`d_model` must be even (sin/cos pairs of §3.5), got {self.d_model}.")
        for field in ("encoder_attention_heads", "decoder_attention_heads"):
            heads = getattr(self, field)
            if self.d_model % heads != 0:
                divisors = [h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]
                raise ValueError(
                    f"`d_model` ({self.d_model}) must be divisible by `{field}` ({heads}); "
                    f"allowed head counts for this d_model include {divisors}."
                )
        for field in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, field)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"`{field}` must be in [0, 1), got {value!r}.")
        if self.activation_function not in ACTIVATIONS:
            raise ValueError(
                f"`activation_function` must be one of {list(ACTIVATIONS)} (the paper uses 'relu'), "
                f"got {self.activation_function!r}."
            )
        if self.layer_norm_eps <= 0:
            raise ValueError(f"`layer_norm_eps` must be positive, got {self.layer_norm_eps!r}.")
        if self.init_std is not None and self.init_std <= 0:
            raise ValueError(f"`init_std` must be positive or None, got {self.init_std!r}.")
        for field in ("add_final_logits_bias", "share_encoder_decoder_embeddings", "fused_output_loss"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"`{field}` must be True or False, got {getattr(self, field)!r}.")
        decoder_vocab_size = self.decoder_vocab_size
        if decoder_vocab_size is not None and (
            isinstance(decoder_vocab_size, bool) or not isinstance(decoder_vocab_size, int) or decoder_vocab_size <= 0
        ):
            raise ValueError(f"`decoder_vocab_size` must be a positive integer or None, got {decoder_vocab_size!r}.")
        if self.share_encoder_decoder_embeddings and decoder_vocab_size not in (None, self.vocab_size):
            raise ValueError(
                f"`decoder_vocab_size` ({decoder_vocab_size}) differs from `vocab_size` ({self.vocab_size}) but "
                "`share_encoder_decoder_embeddings` is True: one shared matrix has one size. Set "
                "`share_encoder_decoder_embeddings=False` for separate source and target vocabularies, or leave "
                "`decoder_vocab_size` unset."
            )
        target = self.target_vocab_size
        limits = {"pad_token_id": min(self.vocab_size, target), "bos_token_id": self.vocab_size}
        limits["decoder_start_token_id"] = target
        for field, limit in limits.items():
            value = getattr(self, field)
            if value is not None and not 0 <= value < limit:
                sizes = f"vocab_size={self.vocab_size}, target vocabulary {target}"
                raise ValueError(f"`{field}` must be in [0, {limit}) ({sizes}), got {value}.")


__all__ = ["PRESETS", "SIZE_FIELDS", "VanillaTransformerConfig"]
