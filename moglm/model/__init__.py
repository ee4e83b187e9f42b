"""The language model around a recurrent stack: embeddings, output heads, sizing by parameter budget."""

from .language_model import LanguageModel, count_parameters, embedding_size
from .mixture_of_softmaxes import MixtureOfSoftmaxes
from .sizing import largest_hidden_size
from .softmax import SoftmaxHead

__all__ = ["LanguageModel", "MixtureOfSoftmaxes", "SoftmaxHead", "count_parameters", "embedding_size",
           "largest_hidden_size"]
