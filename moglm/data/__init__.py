"""Corpora, vocabularies and batching."""

from .batching import Batch, EpisodicBatches, StreamBatches, split_sequences, stripes
from .corpus import FORMATS, SPLITS, Corpus, TextSize, load_corpus
from .vocabulary import EOS, UNK, Vocabulary

__all__ = [
    "Batch", "Corpus", "EOS", "EpisodicBatches", "FORMATS", "SPLITS", "StreamBatches", "TextSize", "UNK",
    "Vocabulary", "load_corpus", "split_sequences", "stripes",
]
