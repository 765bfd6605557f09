"""Text data available offline, a byte-level tokenizer and deterministic batches."""
from jaxsmp.data.text import ByteTokenizer, TokenBatches, default_corpus, load_corpus

__all__ = ["ByteTokenizer", "TokenBatches", "default_corpus", "load_corpus"]
