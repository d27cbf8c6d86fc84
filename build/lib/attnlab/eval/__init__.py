"""Evaluation: perplexity, lm-eval tasks, passkey retrieval and the analysis metrics."""
