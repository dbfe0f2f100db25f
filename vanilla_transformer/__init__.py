"""vanilla-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) for transformers.

Importing the package registers the model with `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM`, and marks the
classes so that `save_pretrained` ships their source next to the weights for `trust_remote_code=True` loading.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .model.configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from .model.embeddings import SinusoidalPositionalEncoding, sinusoidal_positional_encoding
from .model.modeling_vanilla_transformer import (
    VanillaTransformerDecoder,
    VanillaTransformerEncoder,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
    seq2seq_cross_entropy,
    shift_tokens_right,
)

__version__ = "0.1.0"

AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)

VanillaTransformerConfig.register_for_auto_class("AutoConfig")
VanillaTransformerModel.register_for_auto_class("AutoModel")
VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

__all__ = [
    "PRESETS",
    "SinusoidalPositionalEncoding",
    "VanillaTransformerConfig",
    "VanillaTransformerDecoder",
    "VanillaTransformerEncoder",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "seq2seq_cross_entropy",
    "shift_tokens_right",
    "sinusoidal_positional_encoding",
]
