"""Evaluation: cross-entropy, perplexity, bits per character/word, temperature search, MC dropout."""

from .mc_dropout import evaluate_mc_dropout
from .scores import Scores
from .stream import evaluate_stream, stream_features
from .temperature import FACTORS, search_temperature

__all__ = ["FACTORS", "Scores", "evaluate_mc_dropout", "evaluate_stream", "search_temperature", "stream_features"]
