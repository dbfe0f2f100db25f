"""Training (§5): corpora, tokenizer, recipe, trainer and its callbacks, metrics, checkpoint averaging, plots and
the main job."""
