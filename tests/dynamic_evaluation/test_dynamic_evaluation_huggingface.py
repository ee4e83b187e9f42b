"""Dynamic evaluation of a Hugging Face causal LM (``moglm dyneval --hf``; thesis 6.3): a small GPT-2 built from
a config (random weights, no download), trained briefly on a tiny corpus, saved with ``save_pretrained``."""

from __future__ import annotations

import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
tokenizers = pytest.importorskip("tokenizers")

from moglm.cli import main  # noqa: E402
from moglm.dynamic_evaluation import Hyperparameters  # noqa: E402
from moglm.dynamic_evaluation.adapted import ParameterSelection, adapted_tensors  # noqa: E402
from moglm.dynamic_evaluation.huggingface import dyneval_hf, encode_text, load_causal_lm  # noqa: E402
from moglm.errors import MoglmError  # noqa: E402
from moglm.evaluation.context_window import ContextWindowLM  # noqa: E402
from moglm.evaluation.stream import evaluate_stream  # noqa: E402

CORPUS = ("the cat sat on the mat. the dog sat on the log. a cat and a dog met on a mat by the log. "
          "the mat was red and the log was old. ") * 8


NOVEL = "my old red fox ate logs by a cat. " * 12  # a phrase the model never saw, repeated: adaptation learns it
TEXT = "the dog sat on the red mat by the old log."  # shorter than the context: HF's own loss scores it whole


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A 2-layer GPT-2 with a byte-level BPE tokenizer, trained for 40 steps on CORPUS, saved to a directory."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([CORPUS], vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<|endoftext|>",
                                        eos_token="<|endoftext|>")
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = GPT2LMHeadModel(config)
    ids = torch.tensor(tokenizer(CORPUS)["input_ids"])
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(40):
        start = (step * 17) % (len(ids) - 33)
        window = ids[start : start + 32][None]  # [1, 32]
        loss = model(window, labels=window).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    path = tmp_path_factory.mktemp("gpt2")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_learning_rate_zero_scores_exactly_the_models_own_loss(gpt2_dir, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    out = tmp_path / "report.json"
    assert main(["dyneval", "--hf", str(gpt2_dir), "--text", str(text), "--learning-rate", "0", "-n", "8",
                 "--context", "48", "--out", str(out), "--no-progress"]) == 0
    report = json.loads(out.read_text())
    model, tokenizer = load_causal_lm(str(gpt2_dir))
    ids = torch.as_tensor(encode_text(tokenizer, TEXT).ids)[None]  # [1, N]: <|endoftext|> then the text
    assert ids.shape[1] <= 49, "the text must fit one window for HF's loss to see what we see"
    with torch.no_grad():
        own = float(model(ids, labels=ids).loss)
    for row in ("static", "dynamic"):
        assert report["scores"][row]["xent"] == pytest.approx(own, abs=1e-5)
        assert report["scores"][row]["tokens"] == ids.shape[1] - 1
        # per character and per byte: the same total bits over the text's characters and bytes
        bits = own * (ids.shape[1] - 1) / math.log(2)
        assert report["scores"][row]["bits_per_character"] == pytest.approx(bits / len(TEXT), rel=1e-5)
        assert report["scores"][row]["bits_per_byte"] == pytest.approx(bits / len(TEXT.encode()), rel=1e-5)
    assert "bpc" in capsys.readouterr().out


def test_a_stream_longer_than_the_context_is_scored_like_a_plain_window_loop(gpt2_dir):
    """The reference twin: each segment of n tokens read by the model from scratch together with its up to C
    earlier tokens (no cache), the last n logits scored."""
    model, tokenizer = load_causal_lm(str(gpt2_dir))
    ids = torch.as_tensor(encode_text(tokenizer, CORPUS[:400]).ids)  # [N], longer than the 64 positions
    n, context = 5, 23
    expected = []
    with torch.no_grad():
        for start in range(0, len(ids) - 1, n):
            end = min(start + n, len(ids) - 1)
            window = ids[max(0, start - context) : end][None]  # [1, <= C + n]
            logits = model(window).logits[0, -(end - start):]  # [n, V]
            expected.append(torch.nn.functional.cross_entropy(logits, ids[start + 1 : end + 1], reduction="sum"))
    scores = evaluate_stream(ContextWindowLM(model, context), ids.numpy(), 1, n)
    assert scores.tokens == len(ids) - 1
    assert scores.nll == pytest.approx(float(sum(expected)), rel=1e-5)


def test_adaptation_improves_a_repeated_text_and_leaves_the_model_and_embeddings_alone(gpt2_dir, tmp_path):
    model, _ = load_causal_lm(str(gpt2_dir))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = dyneval_hf(str(gpt2_dir), NOVEL, Hyperparameters(rule="sgd", lr=0.03, segment_length=8),
                        context=16, progress=False, log=lambda m: None)
    assert report["scores"]["dynamic"]["xent"] < report["scores"]["static"]["xent"] - 0.05
    adapted = report["adapted"]
    assert adapted["parameters"] < sum(p.numel() for p in model.parameters())  # the embeddings stayed out
    assert not any("wte" in n or "wpe" in n for n in adapted["names"] if n != "...")
    reloaded, _ = load_causal_lm(str(gpt2_dir))
    assert all(torch.equal(before[k], v) for k, v in reloaded.state_dict().items())


def test_selection_by_name_pattern_adapts_only_what_it_names(gpt2_dir):
    model, _ = load_causal_lm(str(gpt2_dir))
    window = ContextWindowLM(model, 16)
    adapted = adapted_tensors(window, selection=ParameterSelection(("*.h.1.*",), ("*.ln_*",)))
    assert adapted.names and all(".h.1." in n and ".ln_" not in n for n in adapted.names)
    frozen = [n for n, p in adapted.model.named_parameters() if not p.requires_grad]
    assert "model.transformer.h.0.attn.c_attn.weight" in frozen
    assert sum(t.numel() for t in adapted.initial) == sum(p.numel() for p in adapted.params)  # th0: adapted only


def test_rms_rules_the_cache_and_the_search_on_held_out_text(gpt2_dir, tmp_path):
    held_out = CORPUS[200:700]
    report = dyneval_hf(str(gpt2_dir), CORPUS[:300], Hyperparameters(lr=1e-3, segment_length=8), context=24,
                        stats_text=held_out, search=False, search_text=held_out, cache=True, cache_size=50,
                        progress=False, log=lambda m: None)
    rows = report["scores"]
    assert set(rows) == {"static", "dynamic", "static_cache", "dynamic_cache"}
    assert report["statistics"] is not None and report["cache"]["static"]["size"] == 50
    assert all(math.isfinite(r["bits_per_character"]) for r in rows.values())


@pytest.mark.parametrize("args, message", [
    (["--context", "60"], "exceeds the model's 64 positions"),
    (["--rule", "rms"], "needs RMS statistics"),
    (["--cache"], "--search-text"),
    (["--adapt", "nothing.matches"], "no parameter matches"),
])
def test_bad_hf_arguments_are_one_line_errors(gpt2_dir, tmp_path, capsys, args, message):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    assert main(["dyneval", "--hf", str(gpt2_dir), "--text", str(text), "-n", "8", "--no-progress", *args]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_missing_model_or_text_is_a_one_line_error(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    assert main(["dyneval", "--hf", str(tmp_path / "no-model"), "--text", str(text), "--no-progress"]) == 1
    assert main(["dyneval", "--hf", str(tmp_path), "--no-progress"]) == 1
    assert main(["dyneval", "--no-progress"]) == 1
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and "no-model: no such directory" in errors[0] and "--text" in errors[1] and "--hf" in errors[2]


class _Bidirectional(torch.nn.Module):
    """Logits from the mean of the whole window's embeddings: every position reads the tokens after it."""

    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(8, 8)

    def forward(self, ids):  # [B, L] -> [B, L, 8]
        return self.embedding(ids).mean(1, keepdim=True).expand(-1, ids.shape[1], -1)


@pytest.mark.parametrize("model, message", [
    (torch.nn.Linear(4, 4), "has no causal-LM interface: calling it on token ids"),
    (torch.nn.Embedding(8, 1), "must give logits [1, 6, V]"),
    (_Bidirectional(), "is not a causal LM: changing the last token changed the logits at earlier positions"),
])
def test_a_model_without_a_causal_interface_is_a_one_line_error(model, message):
    with pytest.raises(MoglmError) as error:
        ContextWindowLM(model, 8)
    assert message in str(error.value) and len(str(error.value).splitlines()) == 1


def test_an_encoder_saved_as_a_causal_lm_is_refused_by_the_command(tmp_path, gpt2_dir, capsys):
    """A BERT directory loads through AutoModelForCausalLM (as BertLMHeadModel, attending both ways): it is
    refused because it is not causal, not scored."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    path = tmp_path / "bert"
    BertForMaskedLM(config).save_pretrained(path)
    _, tokenizer = load_causal_lm(str(gpt2_dir))
    tokenizer.save_pretrained(path)
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    assert main(["dyneval", "--hf", str(path), "--text", str(text), "-n", "8", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert "is not a causal LM" in err and len(err.splitlines()) == 1


def test_a_tokenizer_that_cannot_encode_the_text_is_a_one_line_error(gpt2_dir, tmp_path, capsys):
    """A word-level tokenizer maps an unseen word to its unknown token: scoring that would score "[UNK]", not
    the text, so the command names the word and where it starts instead."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted(set(CORPUS.split()))
    vocab = {"[UNK]": 0, "<s>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=word_level, unk_token="[UNK]", bos_token="<s>")
    with pytest.raises(MoglmError, match=r"cannot encode the text: 'zebra' at character 8 becomes its unknown"):
        encode_text(tokenizer, "the cat zebra sat")
    assert len(encode_text(tokenizer, "the cat sat").ids) == 4  # <s> and three known words
    path = tmp_path / "word-level"
    shutil.copytree(gpt2_dir, path)
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"):
        (path / name).unlink(missing_ok=True)
    tokenizer.save_pretrained(path)
    text = tmp_path / "text.txt"
    text.write_text("the dog sat on the zebra.")
    assert main(["dyneval", "--hf", str(path), "--text", str(text), "-n", "8", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert "cannot encode the text: 'zebra.' at character 19" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("damage", ["truncated weights", "empty weights", "weights of another size",
                                    "corrupt tokenizer"])
def test_a_damaged_model_directory_is_one_line_naming_it(gpt2_dir, tmp_path, capsys, damage):
    import json
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(gpt2_dir, broken)
    weights = broken / "model.safetensors"
    if damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:200])
    elif damage == "empty weights":
        weights.write_bytes(b"")
    elif damage == "weights of another size":
        config = json.loads((broken / "config.json").read_text())
        (broken / "config.json").write_text(json.dumps(config | {"n_embd": 64}))
    else:
        (broken / "tokenizer.json").write_text('{"version": "1.0", "model": [')
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    assert main(["dyneval", "--hf", str(broken), "--text", str(text), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "cannot load a causal LM" in err and str(broken) in err and err.count("\n") == 1 and "Traceback" not in err
