"""Text data: tokenizers, the offline default corpus with random batches, and
prepared (pre-tokenized, memory-mapped) datasets with packed, shuffled batches."""
from jaxsmp.data.dataset import PackedBatches, TokenDataset, is_prepared
from jaxsmp.data.text import TokenBatches, default_corpus, load_corpus
from jaxsmp.data.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer, train_bpe

__all__ = ["ByteTokenizer", "HFTokenizer", "PackedBatches", "TokenBatches", "TokenDataset",
           "default_corpus", "is_prepared", "load_corpus", "load_tokenizer", "train_bpe"]
