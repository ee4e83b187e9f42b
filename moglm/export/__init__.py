"""Export of a trained run to Hugging Face transformers and the Hub: ``moglm export RUN OUT``.

The exported directory holds a :class:`~moglm.export.configuration.MoglmConfig` (``config.json``), the weights
(``model.safetensors``), a tokenizer of the run's vocabulary (:mod:`moglm.export.tokenizer`), a model card
(``README.md``, :mod:`moglm.export.card`) and the two small files that let transformers load it with
``trust_remote_code=True``; after ``import moglm`` it loads without remote code (:mod:`moglm.transformers_registration`).
The model (:class:`~moglm.export.modeling.MoglmForCausalLM`) is moglm's own, and its cache is the recurrent
state (:mod:`moglm.export.modeling`).

This package imports nothing itself; transformers is imported only by the modules that need it.
"""
