"""lm-evaluation-harness (Gao et al., EleutherAI) scoring moglm runs: the ``moglm`` model type.

* :mod:`.settings` the ``model_args`` it knows, checked (one-line errors)
* :mod:`.scorer` a run's model answering lm-eval's requests: ``loglikelihood``, ``loglikelihood_rolling`` (the
  recurrent state carried across a document; with dynamic evaluation, Krause et al. 2018) and ``generate_until``
* :mod:`.loading` a run directory as a scorer
* :mod:`.model` the lm-eval model type (``--model moglm``), registered when imported
* :mod:`.launch` lm-eval's own command line with the type registered (``moglm lm-eval``)
* :mod:`.tasks` local tasks (a YAML task over JSON lines), e.g. WikiText-2's test split page by page

Only :mod:`.model` and :mod:`.launch` import lm-eval (the ``lm-eval`` extra).
"""
