"""Corpora, vocabularies and batching."""

from .batching import Batch, EpisodicBatches, StreamBatches, split_sequences, stripes
from .corpus import FORMATS, SPLITS, Corpus, load_corpus
from .vocabulary import EOS, UNK, Vocabulary

__all__ = [
    "Batch", "Corpus", "EOS", "EpisodicBatches", "FORMATS", "SPLITS", "StreamBatches", "UNK",
    "Vocabulary", "load_corpus", "split_sequences", "stripes",
]
