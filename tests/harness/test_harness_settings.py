"""The model_args of --model moglm: known keys only (an unknown one is one line naming the known ones), values
typed from lm-eval's key=value strings, dynamic-evaluation settings only with dynamic=true."""

from __future__ import annotations

from pathlib import Path

import pytest

from moglm.dynamic_evaluation import Hyperparameters, StatisticsSettings
from moglm.errors import MoglmError
from moglm.harness.settings import HYPERPARAMETERS, KEYS, STATISTICS, HarnessSettings


def test_an_unknown_key_is_one_line_naming_every_known_key():
    with pytest.raises(MoglmError) as error:
        HarnessSettings.from_args({"run": "runs/x", "pretrained": "gpt2"})
    message = str(error.value)
    assert "\n" not in message and "unknown model_args key 'pretrained'" in message
    assert all(key in message for key in KEYS)


@pytest.mark.parametrize("args,message", [
    ({}, "needs model_args run=RUN_DIR"),
    ({"run": "r", "learning_rate": 0.1}, "learning_rate sets dynamic evaluation, which is off (add dynamic=true)"),
    ({"run": "r", "dynamic": "maybe"}, "dynamic must be true or false, got 'maybe'"),
    ({"run": "r", "dynamic": True, "segment_length": "ten"}, "segment_length must be an integer"),
    ({"run": "r", "logit_factor": 0}, "logit_factor must be > 0"),
    ({"run": "r", "dynamic": True, "learning_rate": float("nan")}, "learning_rate must be a finite number"),
    ({"run": "r", "checkpoint": "first"}, "checkpoint must be best or last"),
])
def test_a_wrong_value_is_one_line(args, message):
    with pytest.raises(MoglmError, match=message.replace("(", r"\(").replace(")", r"\)")):
        HarnessSettings.from_args(args)


def test_values_are_typed_and_the_dynamic_keys_name_the_settings_fields():
    settings = HarnessSettings.from_args({"run": "~/runs/x", "dynamic": "true", "learning_rate": "3e-4",
                                          "segment_length": "20", "rule": "sgd", "stats_fraction": "0.5",
                                          "logit_factor": "1.1", "batch_size": "auto", "device": "cpu"})
    assert settings.run == Path("~/runs/x").expanduser() and settings.dynamic is True
    assert settings.hyperparameters == {"lr": 3e-4, "segment_length": 20, "rule": "sgd"}
    assert settings.statistics == {"fraction": 0.5} and settings.logit_factor == 1.1 and settings.device == "cpu"
    assert set(HYPERPARAMETERS.values()) <= set(Hyperparameters.__dataclass_fields__)
    assert set(STATISTICS.values()) <= set(StatisticsSettings.__dataclass_fields__)
