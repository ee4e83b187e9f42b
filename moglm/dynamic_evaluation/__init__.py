"""Dynamic evaluation (Krause thesis ch. 4-5): adapt a language model to the text it is scoring.

* :mod:`.update_rules` the update rules (SGD, decay, global RMS, RMS decay; eq. 4.3-4.7) and the
  deep-learning optimisers the thesis compares them with (momentum, RMSprop; 5.4, eq. 5.10-5.12)
* :mod:`.statistics` global RMS gradient statistics from the training split, cached (eq. 4.4)
* :mod:`.sparse` sparse dynamic evaluation: an adaptation matrix inside the recurrence (4.6, eq. 4.8)
* :mod:`.evaluate` segments, updates, episodic mode, the divergence guard (4.3, eq. 4.2)
* :mod:`.search` the hyperparameter search on a validation prefix (4.5, Mogrifier table 6)
* :mod:`.analysis` loss against position, static vs dynamic (thesis figure 5.2)
* :mod:`.adapted` what adapts: all weights, a selection by name, or the sparse matrices
* :mod:`.with_cache` the neural cache beside and with dynamic evaluation (thesis 2.2.1)
* :mod:`.run` a run directory's checkpoint end to end (``moglm dyneval``)
* :mod:`.huggingface` a Hugging Face causal LM end to end (``moglm dyneval --hf``, thesis 6.3)

Every evaluator reads a model through one contract, :mod:`moglm.evaluation.stream_model`.
"""

from .adapted import ParameterSelection
from .evaluate import DynamicEvaluator, DynamicResult, dynamic_evaluate, static_pass
from .sparse import SparseSpec
from .statistics import StatisticsSettings, gradient_rms
from .update_rules import DEFAULT_RULE, RULES, Hyperparameters, UpdateRule

__all__ = [
    "DEFAULT_RULE",
    "RULES",
    "DynamicEvaluator",
    "DynamicResult",
    "Hyperparameters",
    "ParameterSelection",
    "SparseSpec",
    "StatisticsSettings",
    "UpdateRule",
    "dynamic_evaluate",
    "gradient_rms",
    "static_pass",
]
