"""The model card (``README.md``) of an exported run: Hub metadata, how to load it, the run's metrics
(``results.json``, and ``dyneval/full.json`` when dynamic evaluation ran), its config, its data and the papers
it implements."""

from __future__ import annotations

import json
from pathlib import Path, PurePath
from typing import Any

import yaml

from ..runs.config import RunConfig

MOGRIFIER = "G. Melis, T. Kočiský, P. Blunsom. *Mogrifier LSTM*. ICLR 2020."
THESIS = ("B. Krause. *Flexible Neural Architectures for Sequence Modeling*. PhD thesis, University of "
          "Edinburgh, 2019.")
REPORT = "A student report on input-dependent hidden-to-hidden transitions (the Dyck-RNN and the multi-matrix RNN and LSTM)."

#: the papers each architecture comes from
PAPERS: dict[str, list[str]] = {
    "mogrifier": [MOGRIFIER],
    "mogrifier_gru": [MOGRIFIER],
    "mogrifier_rnn": [MOGRIFIER],
    "lstm": ["S. Hochreiter, J. Schmidhuber. *Long Short-Term Memory*. Neural Computation, 1997."],
    "gru": ["K. Cho et al. *Learning Phrase Representations using RNN Encoder-Decoder for Statistical Machine "
            "Translation*. EMNLP 2014."],
    "rnn": ["J. L. Elman. *Finding Structure in Time*. Cognitive Science, 1990.", THESIS],
    "multiplicative_lstm": ["B. Krause, L. Lu, I. Murray, S. Renals. *Multiplicative LSTM for sequence modelling*. "
                            "ICLR 2017 workshop.", THESIS],
    "mi_lstm": ["Y. Wu, S. Zhang, Y. Zhang, Y. Bengio, R. Salakhutdinov. *On Multiplicative Integration with "
                "Recurrent Neural Networks*. NeurIPS 2016.", THESIS],
    "multiplicative_rnn": ["I. Sutskever, J. Martens, G. Hinton. *Generating Text with Recurrent Neural Networks*. "
                           "ICML 2011.", THESIS],
    "mmrnn": [REPORT],
    "mmlstm": [REPORT],
    "dyck_rnn": [REPORT],
    "transformer": ["Z. Dai et al. *Transformer-XL: Attentive Language Models beyond a Fixed-Length Context*. "
                    "ACL 2019.", THESIS],
}
MIXTURE_OF_SOFTMAXES = ("Z. Yang, Z. Dai, R. Salakhutdinov, W. Cohen. *Breaking the Softmax Bottleneck: A High-Rank "
                        "RNN Language Model*. ICLR 2018.")
DYNAMIC_EVALUATION = ["B. Krause, E. Kahembwe, I. Murray, S. Renals. *Dynamic Evaluation of Neural Sequence Models*. "
                      "ICML 2018.", THESIS]

#: what a score is called in the card, in the order shown
SCORES = (("xent", "cross-entropy (nats/token)"), ("perplexity", "perplexity"), ("bits_per_token", "bits/token"),
          ("bits_per_word", "bits/word"), ("bits_per_character", "bits/character"), ("bits_per_byte", "bits/byte"))


def read_report(path: Path) -> dict[str, Any] | None:
    """A JSON report of the run, or ``None`` when there is none or it is not a JSON object."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "" if value is None else str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.4f}"


def _score_table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """A Markdown table of scores, one row per ``(label, scores)``, with the columns some row has."""
    columns = [(key, name) for key, name in SCORES if any(isinstance(s.get(key), (int, float)) for _, s in rows)]
    lines = ["| | tokens | " + " | ".join(name for _, name in columns) + " |",
             "|---|---:|" + "---:|" * len(columns)]
    for label, scores in rows:
        lines.append(f"| {label} | {_number(scores.get('tokens'))} | "
                     + " | ".join(_number(scores.get(key)) for key, _ in columns) + " |")
    return lines


def _results(results: dict[str, Any] | None, dynamic: dict[str, Any] | None) -> list[str]:
    if not results or not isinstance(results.get("splits"), dict):
        return ["The run has no final evaluation (`results.json`): run `moglm evaluate RUN` and export again."]
    checkpoint = results.get("checkpoint") or {}
    lines = [f"`moglm evaluate` on the run's held-out splits, one stream from a zero state, at the softmax temperature "
             f"(logit factor) {_number(results.get('temperature', 1.0))} searched on validation; checkpoint "
             f"`{checkpoint.get('which', 'best')}` at step {checkpoint.get('step', '?')}"
             f"{' (averaged weights)' if checkpoint.get('weights') == 'averaged' else ''}.", ""]
    lines += _score_table([(split, scores) for split, scores in results["splits"].items() if isinstance(scores, dict)])
    if dynamic and isinstance(dynamic.get("splits"), dict):
        hp = dynamic.get("hyperparameters") or {}
        settings = ", ".join(f"{k} {v}" for k, v in hp.items())
        lines += ["", f"Dynamic evaluation (`moglm dyneval`; {settings}): the weights adapt to the text while it is "
                  "scored (Krause et al. 2018). The exported weights are the static ones.", ""]
        rows = []
        for split, result in dynamic["splits"].items():
            if isinstance(result, dict):
                rows += [(f"{split}, static", result.get("static") or {}), (f"{split}, dynamic", result.get("dynamic") or {})]
        lines += _score_table(rows)
    machine = (results.get("provenance") or {}).get("machine") or {}
    if machine.get("cpu"):
        lines += ["", f"Measured on {machine['cpu']} ({machine.get('cores', '?')} cores) by "
                  f"`{(results.get('provenance') or {}).get('command', 'moglm evaluate')}`."]
    return lines


def _config(config: RunConfig, model_info: dict[str, Any], vocab_size: int) -> list[str]:
    m = config.model
    rows = [("architecture", f"`{m.architecture}`"), ("layers", m.num_layers),
            ("hidden size", model_info.get("hidden_size")), ("embedding size", model_info.get("embedding_size")),
            ("parameters", model_info.get("num_params")), ("vocabulary", vocab_size),
            ("tied embeddings", m.tie_embeddings), ("skip-sum of layers", m.skip_sum),
            ("softmax", f"mixture of {m.mos_components}" if m.mos_components > 1 else "one"),
            ("cell options", ", ".join(f"{k} = {v}" for k, v in m.cell.items()) or "defaults"),
            ("dropout (input, inter-layer, state, output)",
             f"{m.input_dropout}, {m.inter_layer_dropout}, {m.state_dropout}, {m.output_dropout}")]
    t = config.train
    rows += [("training", f"{t.max_steps:,} steps of {t.batch_size} x {t.bptt} tokens, {t.optimizer}, learning rate "
                          f"{t.learning_rate}")]
    lines = ["| | |", "|---|---|"] + [f"| {k} | {_number(v) if isinstance(v, int) and not isinstance(v, bool) else v} |"
                                      for k, v in rows if v is not None]
    return lines + ["", "The full config is `moglm_config.toml` beside this card."]


def _data(config: RunConfig, level: str, unk: str | None) -> list[str]:
    d = config.data
    name = PurePath(d.path).name if d.path else "the Python documentation shipped with the interpreter"
    return [f"Corpus `{name}`, format `{d.format}` ({'one token per ' + level if level in ('char', 'byte') else level}"
            f" level); the vocabulary is the training split's{', with ' + repr(unk) + ' for the rest' if unk else ''}."
            f" The tokenizer splits text as moglm splits a prompt, and starts every text with the line separator, "
            "as every line of the training text followed one; decode with `skip_special_tokens=False` to keep the "
            "line breaks."]


def model_card(name: str, config: RunConfig, model_info: dict[str, Any], vocab_size: int, level: str,
               unk: str | None, results: dict[str, Any] | None, dynamic: dict[str, Any] | None,
               repo: str | None = None) -> str:
    """The card's Markdown text, with the Hub's YAML front matter."""
    architecture = config.model.architecture
    meta = {"library_name": "transformers", "license": "apache-2.0", "pipeline_tag": "text-generation",
            "tags": ["moglm", architecture.replace("_", "-"), "custom_code"]}
    where = repo or "OUT"
    papers = list(PAPERS.get(architecture, []))
    if config.model.mos_components > 1:
        papers.append(MIXTURE_OF_SOFTMAXES)
    if dynamic:
        papers += [p for p in DYNAMIC_EVALUATION if p not in papers]
    lines = ["---", yaml.safe_dump(meta, sort_keys=False).strip(), "---", "", f"# {name}", ""]
    if config.description:
        lines += [config.description, ""]
    lines += [f"A `{architecture}` language model trained with moglm and exported by `moglm export`. Loading it needs "
              "moglm installed (its model is moglm's own). Its cache is the recurrent state, so `generate()` reads "
              "one token per step.", "",
              "## Use", "", "```python",
              "import moglm  # registers model type 'moglm'; or pass trust_remote_code=True without it",
              "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
              f'model = AutoModelForCausalLM.from_pretrained("{where}")',
              f'tokenizer = AutoTokenizer.from_pretrained("{where}")',
              'ids = tokenizer("the", return_tensors="pt").input_ids',
              "print(tokenizer.decode(model.generate(ids, max_new_tokens=20, do_sample=False)[0]))", "```", "",
              "The logits are log-probabilities at the run's searched softmax temperature (`config.logit_factor`).",
              "", "## Results", ""]
    lines += _results(results, dynamic)
    lines += ["", "## Model", ""] + _config(config, model_info, vocab_size)
    lines += ["", "## Data", ""] + _data(config, level, unk)
    lines += ["", "## Papers", ""] + [f"* {p}" for p in papers]
    return "\n".join(lines) + "\n"
