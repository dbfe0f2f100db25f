"""The encoder and decoder stacks (§3.1): the input representation (§3.4, §3.5) followed by N identical layers, and
`VanillaTransformerPreTrainedModel`, the transformers base class they share with the full models.

Imports only torch, transformers and siblings, so that it can be shipped as remote code.
"""

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPastAndCrossAttentions
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .attention import MultiHeadAttention
from .configuration_vanilla_transformer import VanillaTransformerConfig
from .embeddings import InputRepresentation
from .input_checks import check_batch_size, check_mask, check_token_ids
from .kernels import Linear, is_tracing
from .layers import DecoderLayer, EncoderLayer

AUTO_MAP = {
    "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
    "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
    "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
}


class VanillaTransformerPreTrainedModel(PreTrainedModel):
    """What every class of the model shares with transformers: the config class, the supported attention backends
    and compilation, activation checkpointing, the initialisation, and the `auto_map` of saved folders."""

    config: VanillaTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["EncoderLayer", "DecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True

    def __init__(self, config: VanillaTransformerConfig, *inputs, **kwargs):
        super().__init__(config, *inputs, **kwargs)
        # Saved folders load through every Auto class with trust_remote_code=True, where the package is not installed
        # (save_pretrained alone would map only the config and the class being saved).
        self.config.auto_map = {**AUTO_MAP, **(getattr(self.config, "auto_map", None) or {})}

    def set_cpu_weight_packing(self, enabled: bool) -> None:
        """Turn the packed CPU inference path (`config.cpu_weight_packing`, see `kernels.py`) on or off for the
        decoder's projections and `lm_head`, the products that decoding repeats once per token. Turning it off
        frees the packed copies."""
        self.config.cpu_weight_packing = enabled
        decoders = [m for m in self.modules() if isinstance(m, VanillaTransformerDecoder)]
        targets = [m for d in decoders for m in d.modules()] + [getattr(self, "lm_head", None)]
        for module in targets:
            if isinstance(module, Linear):
                module.packed_inference = enabled
                if not enabled:
                    module.release_packed_weight()

    def _init_weights(self, module: nn.Module) -> None:
        """The paper does not state its initialisation. Every projection and embedding is drawn from N(0, init_std²)
        (0.02, transformers' Marian/BART convention), biases zero, LayerNorm γ = 1, β = 0. `init_std=None` selects
        fairseq's scheme instead: Xavier-uniform projections and N(0, d_model^-1) embeddings.

        Deviation from fairseq's scheme (kept as the opt-in `init_std=None`): with the shared embedding also serving as
        the output projection, its d_model^-0.5 scale gives large initial logits and trains markedly worse under short
        warmups and gradient clipping (docs/training.md, "Initialisation"); N(0, 0.02) trains well under both the
        paper's recipe and common fine-tuning recipes.
        """
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            if module is getattr(self, "lm_head", None) and self.config.tie_word_embeddings:
                return  # the shared embedding, initialised below
            if std is None:
                init.xavier_uniform_(module.weight)
            else:
                init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std if std is not None else self.config.d_model**-0.5)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                with torch.no_grad():
                    module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        if getattr(module, "final_logits_bias", None) is not None:
            init.zeros_(module.final_logits_bias)


class TransformerStack(VanillaTransformerPreTrainedModel):
    """What the encoder and decoder stacks share: the token embeddings, the input representation (§3.4, §3.5) and
    N identical layers."""

    def __init__(
        self, config: VanillaTransformerConfig, layer_class: type[nn.Module], num_layers: int, vocab_size: int
    ):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(vocab_size, config.d_model, config.pad_token_id)  # E (§3.4)
        self.input_representation = InputRepresentation(config.d_model, config.scale_embedding, config.dropout)
        self.layers = nn.ModuleList([layer_class(config, layer_idx=i) for i in range(num_layers)])
        # Deviation from paper: pre-LN stacks need a final LayerNorm; post-LN (the paper) has none.
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        self.gradient_checkpointing = False
        self.post_init()


class VanillaTransformerEncoder(TransformerStack):
    """The encoder stack: (embeddings × √d_model + PE) → dropout → N × EncoderLayer (§3.1)."""

    _can_record_outputs = {
        "hidden_states": EncoderLayer,
        "attentions": OutputRecorder(MultiHeadAttention, index=1, layer_name="self_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config, EncoderLayer, config.encoder_layers, config.vocab_size)

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        """input_ids: (batch, src_len); attention_mask: (batch, src_len), 1 = token, 0 = padding."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds` to the encoder.")
        if inputs_embeds is None:
            check_token_ids("input_ids", input_ids, self.config.vocab_size)
            inputs_embeds = self.embed_tokens(input_ids)
        batch_size, src_len = inputs_embeds.shape[:2]
        check_mask("attention_mask", attention_mask, batch_size, (src_len,), "the source of shape (batch, src_len)")

        hidden_states = self.input_representation(inputs_embeds)

        attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VanillaTransformerDecoder(TransformerStack):
    """The decoder stack: (embeddings × √d_model + PE) → dropout → N × DecoderLayer (§3.1).

    Positions continue from the cache length, so incremental decoding sees the same encodings as a full pass.
    """

    _can_record_outputs = {
        "hidden_states": DecoderLayer,
        "attentions": OutputRecorder(MultiHeadAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(MultiHeadAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config, DecoderLayer, config.decoder_layers, config.target_vocab_size)
        self.set_cpu_weight_packing(config.cpu_weight_packing)

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """input_ids: (batch, tgt_len) new tokens; encoder_hidden_states: (batch, src_len, d_model);
        cache: an `EncoderDecoderCache` (self-attention keys/values so far, cross-attention keys/values)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(
                "Pass exactly one of `decoder_input_ids` or `decoder_inputs_embeds`; to train, pass `labels` and the "
                "decoder inputs are built from them."
            )
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs `encoder_hidden_states` to attend to (§3.2.3).")
        if inputs_embeds is None:
            check_token_ids("decoder_input_ids", input_ids, self.embed_tokens.num_embeddings)
            inputs_embeds = self.embed_tokens(input_ids)
        batch_size, tgt_len = inputs_embeds.shape[:2]

        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_len = cache.get_seq_length() if cache is not None else 0
        if not is_tracing():  # `int(past_len)` would be a graph break
            check_batch_size(
                "The decoder input", batch_size, encoder_hidden_states.shape[0], "the encoder output",
                "`decoder_input_ids`/`labels` need one row per source row.",
            )  # fmt: skip
            check_mask(
                "decoder_attention_mask", attention_mask, batch_size, (tgt_len, int(past_len) + tgt_len),
                "the decoder input of shape (batch, past + tgt_len)",
            )  # fmt: skip
            check_mask(
                "attention_mask", encoder_attention_mask, batch_size, (encoder_hidden_states.shape[1],),
                "the encoder output of shape (batch, src_len)",
            )  # fmt: skip

        hidden_states = self.input_representation(inputs_embeds, offset=past_len)

        mask_over_new_tokens_only = (
            attention_mask is not None
            and attention_mask.dim() == 2
            and not is_tracing()
            and attention_mask.shape[1] == tgt_len
            and int(past_len) > 0
        )
        if mask_over_new_tokens_only:  # every cached token stays visible
            attention_mask = torch.cat([attention_mask.new_ones(batch_size, int(past_len)), attention_mask], dim=1)
        self_attn_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        causal_mask = create_causal_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask, cache=self_attn_cache
        )
        cross_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, for activation checkpointing
                encoder_attention_mask=cross_mask,
                cache=cache,
                **kwargs,
            )
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, cache=cache)
