"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers model.

Reading order follows the paper: embeddings (embeddings.py) → attention (attention.py) → layers (layers.py) →
the encoder and decoder stacks → the encoder-decoder model → the head with the shared pre-softmax projection.
This file imports only torch, transformers and its siblings, so that `save_pretrained` can ship it as remote code.
"""

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .attention import MultiHeadAttention
from .configuration_vanilla_transformer import VanillaTransformerConfig
from .embeddings import InputRepresentation
from .kernels import Linear, cross_entropy, is_tracing, packed_weights
from .layers import DecoderLayer, EncoderLayer
from .loss import IGNORE_INDEX

logger = logging.get_logger(__name__)

AUTO_MAP = {
    "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
    "AutoModel": "modeling_vanilla_transformer.VanillaTransformerModel",
    "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
}


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder inputs: `<start> y_1 ... y_{n-1}` from labels `y_1 ... y_n` (-100 becomes pad)."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def seq2seq_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Token-level cross-entropy with optional label smoothing (§5.4), ignoring -100 labels (no shift: labels are
    aligned with the logits).

    Mean over the non-ignored tokens, or their sum divided by `num_items_in_batch` when the Trainer gives it, so that
    gradient accumulation weighs every token equally. The per-token losses come from `kernels.cross_entropy`.
    """
    flat_logits = logits.float().flatten(0, 1)  # (batch * tgt_len, vocab)
    flat_labels = labels.flatten().to(logits.device)
    per_token = cross_entropy(flat_logits, flat_labels, label_smoothing)  # (batch * tgt_len,)
    if num_items_in_batch is not None:
        return per_token.sum() / num_items_in_batch
    return per_token.sum() / (flat_labels != IGNORE_INDEX).sum()


def _check_token_ids(name: str, ids: torch.Tensor | None, vocab_size: int, allow_ignore: bool = False) -> None:
    """A clear error for ids of the wrong type, rank or size, or outside the vocabulary, instead of a reshape or
    IndexError from deep inside torch."""
    if ids is None or is_tracing():
        return
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"`{name}` must be a torch.LongTensor of shape (batch, length), got {type(ids).__name__}.")
    if ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape (batch, length), got shape {tuple(ids.shape)}.")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(
            f"`{name}` is empty (shape {tuple(ids.shape)}): it needs at least one sequence of at least one token "
            "(the tokenizer adds </s> even to an empty sentence)."
        )
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"`{name}` must hold integer token ids, got dtype {ids.dtype}.")
    low, high = torch.aminmax(ids)  # one pass; this check runs at every decoding step
    if int(low) >= 0 and int(high) < vocab_size:
        return
    valid = (ids >= 0) & (ids < vocab_size)
    if allow_ignore:
        valid |= ids == -100
    if not bool(valid.all()):
        bad = ids[~valid]
        raise ValueError(
            f"`{name}` holds ids outside the vocabulary [0, {vocab_size}): e.g. {bad[:5].tolist()}"
            f"{' (-100 marks ignored labels)' if allow_ignore else ''}. Do the tokenizer and the model config "
            f"(vocab_size={vocab_size}) agree?"
        )


def _check_mask(name: str, mask: torch.Tensor | None, batch_size: int, lengths: tuple[int, ...], of: str) -> None:
    if mask is None or mask.dim() != 2:  # 4D masks are passed through as the caller built them
        return
    if mask.shape[0] != batch_size or mask.shape[1] not in lengths:
        raise ValueError(
            f"`{name}` has shape {tuple(mask.shape)} but {of} needs (batch={batch_size}, length in {list(lengths)}): "
            f"one 1/0 entry per token (1 = real token, 0 = padding)."
        )


class VanillaTransformerPreTrainedModel(PreTrainedModel):
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
        warmups and gradient clipping (docs/TRAINING.md, "Initialisation"); N(0, 0.02) trains well under both the
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
            _check_token_ids("input_ids", input_ids, self.config.vocab_size)
            inputs_embeds = self.embed_tokens(input_ids)
        batch_size, src_len = inputs_embeds.shape[:2]
        _check_mask("attention_mask", attention_mask, batch_size, (src_len,), "the source of shape (batch, src_len)")

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
            _check_token_ids("decoder_input_ids", input_ids, self.embed_tokens.num_embeddings)
            inputs_embeds = self.embed_tokens(input_ids)
        batch_size, tgt_len = inputs_embeds.shape[:2]

        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_len = cache.get_seq_length() if cache is not None else 0
        if not is_tracing():
            if encoder_hidden_states.shape[0] != batch_size:
                raise ValueError(
                    f"The decoder input has batch size {batch_size} but the encoder output "
                    f"{encoder_hidden_states.shape[0]}: `decoder_input_ids`/`labels` need one row per source row."
                )
            _check_mask(
                "decoder_attention_mask", attention_mask, batch_size, (tgt_len, int(past_len) + tgt_len),
                "the decoder input of shape (batch, past + tgt_len)",
            )  # fmt: skip
            _check_mask(
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


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """The encoder-decoder (Figure 1) with one embedding matrix, `shared`, for source and target tokens (§3.4).

    With `config.share_encoder_decoder_embeddings=False` there is no `shared`: the encoder and the decoder keep
    embedding matrices of their own (sizes `vocab_size` and `decoder_vocab_size`), Marian's layout for separate
    vocabularies.
    """

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            if config.tie_word_embeddings:
                self._tied_weights_keys = {
                    "encoder.embed_tokens.weight": "shared.weight",
                    "decoder.embed_tokens.weight": "shared.weight",
                }
        self.encoder = VanillaTransformerEncoder(config)
        self.decoder = VanillaTransformerDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        if self.config.share_encoder_decoder_embeddings:
            return self.shared
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        if not self.config.share_encoder_decoder_embeddings:  # the source side only, as Marian does
            self.encoder.embed_tokens = value
            return
        self.shared = value
        if self.config.tie_word_embeddings:
            self.encoder.embed_tokens = value
            self.decoder.embed_tokens = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        """Encode the source (unless `encoder_outputs` are given), then decode `decoder_input_ids` with the cache.

        Masks are 1 for real tokens and 0 for padding (transformers' convention)."""
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            raise ValueError(
                "The decoder has no input: pass `decoder_input_ids` (or `decoder_inputs_embeds`), or `labels` to "
                "VanillaTransformerForConditionalGeneration, which builds them by shifting the labels right."
            )
        if encoder_outputs is None:
            if input_ids is not None and attention_mask is not None and attention_mask.dim() == 2:
                _check_mask("attention_mask", attention_mask, input_ids.shape[0], (input_ids.shape[1],), "`input_ids`")
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, GenerationMixin):
    """The encoder-decoder with the pre-softmax projection `lm_head`, whose weight is the shared embedding matrix
    (§3.4), and the token-level cross-entropy loss. Label smoothing (§5.4) is the Trainer's
    `label_smoothing_factor`."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = Linear(config.d_model, config.target_vocab_size, bias=False)
        if config.tie_word_embeddings:
            source = "shared" if config.share_encoder_decoder_embeddings else "decoder.embed_tokens"
            self._tied_weights_keys = {"lm_head.weight": f"model.{source}.weight"}
        if config.add_final_logits_bias:
            # Deviation from paper: Marian adds a trained bias to the logits (opt-in, for imported checkpoints).
            self.register_buffer("final_logits_bias", torch.zeros(1, config.target_vocab_size))  # (1, vocab)
        else:
            self.final_logits_bias = None
        self.post_init()
        self.set_cpu_weight_packing(config.cpu_weight_packing)

    def generate(self, *args, **kwargs):
        """`GenerationMixin.generate`, unchanged in what it returns. On CPU in fp32, with `config.cpu_weight_packing`,
        the decoder's and `lm_head`'s products run on weights packed once by oneDNN (see `kernels.py`)."""
        config = kwargs.get("generation_config")
        for name in ("num_beams", "max_new_tokens"):
            value = kwargs.get(name, getattr(config, name, None))
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"generate(): `{name}` must be an integer >= 1, got {value!r}.")
        with packed_weights(self):
            return super().generate(*args, **kwargs)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def _reorder_cache(self, cache: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search: gather the self-attention keys/values of the surviving beams (`beam_idx`: (batch * beams,)).

        The cross-attention keys/values are left in place: `generate()` repeats each source once per beam, so all
        beams of a sentence hold the same rows, and `beam_idx` only picks beams of the same sentence; gathering them
        (what `EncoderDecoderCache.reorder_cache` does) would copy identical rows every step.
        """
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)
        return cache

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        label_smoothing: float = 0.0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        """As `VanillaTransformerModel.forward`, plus `labels` (batch, tgt_len) with -100 for ignored positions:
        when given, the loss is returned and missing decoder inputs are the labels shifted right.
        `label_smoothing` is ε of §5.4 (`TranslationTrainer` passes the Trainer's `label_smoothing_factor`)."""
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is not None:
            _check_token_ids("labels", labels, self.config.target_vocab_size, allow_ignore=True)
            source = input_ids if input_ids is not None else inputs_embeds
            if (
                isinstance(source, torch.Tensor)
                and source.dim() > 1
                and not is_tracing()
                and labels.shape[0] != len(source)
            ):
                raise ValueError(
                    f"`labels` has batch size {labels.shape[0]} but the inputs have {source.shape[0]}: one row of "
                    "target ids per source row."
                )
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (batch, tgt_len, vocab)
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias.to(logits.dtype)
        loss = None
        if labels is not None:
            if labels.shape != logits.shape[:2]:
                raise ValueError(
                    f"`labels` has shape {tuple(labels.shape)} but the decoder produced {tuple(logits.shape[:2])}."
                )
            loss = seq2seq_cross_entropy(logits, labels, num_items_in_batch, label_smoothing)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )


__all__ = [
    "VanillaTransformerPreTrainedModel",
    "TransformerStack",
    "VanillaTransformerEncoder",
    "VanillaTransformerDecoder",
    "VanillaTransformerModel",
    "VanillaTransformerForConditionalGeneration",
    "shift_tokens_right",
    "seq2seq_cross_entropy",
]
