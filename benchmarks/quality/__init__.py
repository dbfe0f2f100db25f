"""Quality evaluations of trained models: BLEU/chrF against references, run as `python -m benchmarks.quality.X`."""
