"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a transformers model.

The encoder-decoder (Figure 1) and the head with the shared pre-softmax projection and the training loss. The imports
below name every sibling, in the paper's reading order: configuration → embeddings (§3.4, §3.5) → attention (§3.2) →
layers (§3.1, §3.3) → stacks (§3.1); `kernels` (with the loss math of `loss`) holds the speed paths and
`input_checks` the input validation. This file imports only torch, transformers and its siblings, each directly
(transformers copies only direct imports when loading remote code from a local folder), so that `save_pretrained` can
ship it as remote code.
"""

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, logging
from transformers.utils.deprecation import deprecate_kwarg

from .attention import MultiHeadAttention
from .configuration_vanilla_transformer import VanillaTransformerConfig
from .embeddings import InputRepresentation, SinusoidalPositionalEncoding
from .input_checks import check_batch_size, check_mask, check_token_ids
from .kernels import Linear, cross_entropy, fuses_output_loss, linear_cross_entropy, packed_weights
from .layers import DecoderLayer, EncoderLayer
from .loss import IGNORE_INDEX
from .stacks import (
    AUTO_MAP,
    TransformerStack,
    VanillaTransformerDecoder,
    VanillaTransformerEncoder,
    VanillaTransformerPreTrainedModel,
)

logger = logging.get_logger(__name__)


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder inputs: `<start> y_1 ... y_{n-1}` from labels `y_1 ... y_n` (`IGNORE_INDEX` becomes
    pad). labels: (batch, tgt_len) → (batch, tgt_len)."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == IGNORE_INDEX, pad_token_id)


def seq2seq_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Token-level cross-entropy with optional label smoothing (§5.4), ignoring `IGNORE_INDEX` labels (no shift: the
    labels are aligned with the logits).

    Args:
        logits: (batch, tgt_len, vocab)
        labels: (batch, tgt_len) target ids, `IGNORE_INDEX` (-100) where no loss is taken.
        num_items_in_batch: the Trainer's count of target tokens over the accumulated batches, if given.
        label_smoothing: ε of §5.4.
    Returns:
        The mean over the non-ignored tokens, or their sum divided by `num_items_in_batch` when the Trainer gives it,
        so that gradient accumulation weighs every token equally (a 0-d tensor).
    """
    flat_labels = labels.flatten().to(logits.device)  # (batch * tgt_len,)
    per_token = cross_entropy(logits.flatten(0, 1), flat_labels, label_smoothing)  # (batch * tgt_len,) fp32
    return _token_mean(per_token.sum(), flat_labels, num_items_in_batch)


def _token_mean(total: torch.Tensor, flat_labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None):
    """The summed loss over the non-ignored tokens, divided by `num_items_in_batch` if given, else by their count."""
    if num_items_in_batch is not None:
        return total / num_items_in_batch
    return total / (flat_labels != IGNORE_INDEX).sum()


def seq2seq_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """`seq2seq_cross_entropy` of the logits `hidden @ weight.T + bias`, computed without them: the output projection
    and the loss (label smoothing of §5.4) run together in row chunks (`kernels.linear_cross_entropy`).

    Args:
        hidden: (batch, tgt_len, d_model) decoder output.
        weight: (vocab, d_model) output projection (`lm_head.weight`, tied to the embedding, §3.4).
        bias: (vocab,) added to the logits (`final_logits_bias`), or None.
        labels, num_items_in_batch, label_smoothing: as `seq2seq_cross_entropy`.
    Returns:
        The loss `seq2seq_cross_entropy` gives (a 0-d tensor).
    """
    flat_labels = labels.flatten().to(hidden.device)  # (batch * tgt_len,)
    total = linear_cross_entropy(hidden.flatten(0, 1), weight, bias, flat_labels, label_smoothing)
    return _token_mean(total, flat_labels, num_items_in_batch)


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
                check_mask("attention_mask", attention_mask, input_ids.shape[0], (input_ids.shape[1],), "`input_ids`")
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
    `label_smoothing_factor`.

    `lm_head` stays a module (hooks, PEFT, `get_output_embeddings` and exporters see it), but in eager CPU fp32
    training with `config.fused_output_loss` the loss is computed from `lm_head.weight` directly, chunk by chunk
    (`seq2seq_linear_cross_entropy`), and `outputs.logits` is None. The trade: forward hooks on `lm_head` would be
    bypassed there, so the path is only taken when it has none and is the plain `Linear` built here
    (`kernels.fuses_output_loss`); evaluation, generation and every other case call `lm_head` and return logits.
    """

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

    def resize_token_embeddings(self, *args, **kwargs) -> nn.Embedding:
        """`PreTrainedModel.resize_token_embeddings` (the source vocabulary; with shared embeddings, both), with the
        config's `decoder_vocab_size` kept equal to the shared `vocab_size` (so that the saved config loads) and
        `final_logits_bias` (when there is one) following the output vocabulary: new tokens get a bias of 0."""
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        if self.config.share_encoder_decoder_embeddings:
            self.config.decoder_vocab_size = self.config.vocab_size
        if self.final_logits_bias is not None:
            old_bias, rows = self.final_logits_bias, self.lm_head.weight.shape[0]
            new_bias = old_bias.new_zeros(1, rows)  # (1, new vocab)
            kept = min(rows, old_bias.shape[1])
            new_bias[:, :kept] = old_bias[:, :kept]
            self.register_buffer("final_logits_bias", new_bias)
        return embeddings

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
        """As `VanillaTransformerModel.forward`, plus `labels` (batch, tgt_len) with `IGNORE_INDEX` (-100) for ignored
        positions:
        when given, the loss is returned and missing decoder inputs are the labels shifted right.
        `label_smoothing` is ε of §5.4 (`TranslationTrainer` passes the Trainer's `label_smoothing_factor`).
        In training mode with `labels`, on the fused path (`config.fused_output_loss`, see the class docstring), the
        loss comes without logits: `outputs.logits` is None."""
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is not None:
            check_token_ids("labels", labels, self.config.target_vocab_size, allow_ignore=True)
            source = input_ids if input_ids is not None else inputs_embeds
            if isinstance(source, torch.Tensor) and source.dim() > 1:
                hint = "one row of target ids per source row."
                check_batch_size("`labels`", labels.shape[0], source.shape[0], "the inputs have", hint)
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
        hidden = outputs.last_hidden_state  # (batch, tgt_len, d_model)
        if labels is not None and labels.shape != hidden.shape[:2]:
            raise ValueError(
                f"`labels` has shape {tuple(labels.shape)} but the decoder produced {tuple(hidden.shape[:2])}."
            )
        logits = loss = None
        if (
            labels is not None
            and self.training
            and self.config.fused_output_loss
            and fuses_output_loss(self.lm_head, hidden)
        ):
            bias = None if self.final_logits_bias is None else self.final_logits_bias[0].to(hidden.dtype)
            loss = seq2seq_linear_cross_entropy(
                hidden, self.lm_head.weight, bias, labels, num_items_in_batch, label_smoothing
            )
        else:
            logits = self.lm_head(hidden)  # (batch, tgt_len, vocab)
            if self.final_logits_bias is not None:
                logits = logits + self.final_logits_bias.to(logits.dtype)
            if labels is not None:
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


# The building blocks are importable from here too: after a remote-code load this module is the only one users can
# name (e.g. for FSDP's `transformer_layer_cls={EncoderLayer, DecoderLayer}`).
__all__ = [
    "AUTO_MAP",
    "DecoderLayer",
    "EncoderLayer",
    "InputRepresentation",
    "MultiHeadAttention",
    "SinusoidalPositionalEncoding",
    "TransformerStack",
    "VanillaTransformerConfig",
    "VanillaTransformerDecoder",
    "VanillaTransformerEncoder",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "seq2seq_cross_entropy",
    "seq2seq_linear_cross_entropy",
    "shift_tokens_right",
]
