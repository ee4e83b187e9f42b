"""Model type "moglm" in transformers' Auto classes (moglm.transformers_registration): ``import moglm`` imports no
transformers; importing transformers afterwards registers the config, and a stand-in for the model until a model
is made, so that a process using only transformers' tokenizers never imports transformers' modeling code."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

PROBE = """
import sys
import moglm
assert "transformers" not in sys.modules
from transformers import AutoTokenizer
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from moglm.export.configuration import MoglmConfig
print("moglm" in CONFIG_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING[MoglmConfig].__name__,
      "transformers.modeling_utils" in sys.modules)
from moglm.export.modeling import MoglmForCausalLM
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_config(MoglmConfig(vocab_size=5, hidden_size=4, moglm_model={"cell": {"rank": 2}}))
print(MODEL_FOR_CAUSAL_LM_MAPPING[MoglmConfig] is MoglmForCausalLM)  # the first model made takes its place
"""


@pytest.mark.slow
def test_import_moglm_then_a_tokenizer_registers_the_config_and_a_stand_in_without_the_model_code():
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", PROBE], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "DeferredMoglmForCausalLM", "False", "True"]
