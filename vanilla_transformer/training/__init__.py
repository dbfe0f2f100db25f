"""Training (§5): corpora, tokenizer, recipe, trainer, metrics, checkpoint averaging, plots and the main job."""
