"""Decoding (greedy, beam search) and evaluation metrics."""
