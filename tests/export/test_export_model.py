"""``moglm export`` round trips for every architecture a run can hold: a tiny run trained in-process for two steps,
exported, loaded by ``AutoModelForCausalLM.from_pretrained`` (after ``import moglm``): its logits equal moglm's to
1e-5 in float32 (in one pass and in chunks that carry the cache), greedy ``generate()`` equals moglm's sampling
at temperature 0 (top-1), and generation reads one token per step."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from conftest import tiny_config, write_tiny_corpus  # noqa: E402

import moglm  # noqa: E402
from moglm.export.run import export_run  # noqa: E402
from moglm.modules import ARCHITECTURES  # noqa: E402
from moglm.sampling import sample  # noqa: E402

TEXT = "the cat sees the dog .\nthe owl likes the fish .\nthe cow hears the bird ."
PROMPT = "the dog likes"


def model_section(architecture: str, **extra) -> dict:
    """A tiny model of ``architecture`` (cell options that fit 8 units)."""
    section = {"architecture": architecture, "hidden_size": 8, "num_layers": 2, "cell": {}}
    if architecture.startswith("mogrifier"):
        section["cell"] = {"rounds": 3, "rank": 2}
    if architecture == "transformer":
        section.update(cell={"heads": 2, "memory": 6}, state_dropout=0.0)
    return section | extra


#: every architecture a run can hold, and the model options that change the exported structure
VARIANTS = {name: model_section(name) for name in ARCHITECTURES} | {
    "transformer": model_section("transformer"),
    "transformer-xl-post": model_section("transformer", cell={"heads": 2, "memory": 4, "positions": "xl",
                                                               "norm": "post"}),
    "mogrifier-mos-untied": model_section("mogrifier", mos_components=2, tie_embeddings=False,
                                          input_embedding_ratio=0.5),
    "lstm-weight-norm": model_section("lstm", weight_norm=True, orthogonal_init=1.0, forget_bias=1.0),
}


def train_tiny_run(root, model: dict, data: dict | None = None, **train):
    """A run of ``model`` trained for two steps on a tiny word corpus in ``root / "run"``."""
    from moglm.train import Trainer

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOGLM_CACHE_DIR", str(root / "cache"))
        corpus = write_tiny_corpus(root / "tiny", lines_per_split=(60, 10, 10))
        cfg = tiny_config(corpus, model=model, data=data or {}, train={"max_steps": 2, "eval_every": 2, "bptt": 6,
                                                                       **train},
                          sample={"num_tokens": 0}, evaluation={"temperature_tokens": 50})
        Trainer(cfg, root / "run", progress=False, log=lambda s: None).train()
    return root / "run"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """``variant -> (run, exported folder)``, made on first use."""
    made = {}

    def get(variant: str):
        if variant not in made:
            root = tmp_path_factory.mktemp(variant)
            run = train_tiny_run(root, VARIANTS[variant])
            made[variant] = run, export_run(run, root / "export")
        return made[variant]

    return get


def load(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def moglm_chunks(run, ids: torch.Tensor, size: int) -> torch.Tensor:
    """moglm's log-probabilities ``[N, V]`` of ``ids`` ``[N]`` read in chunks of ``size``, carrying the state."""
    out, state = [], None
    with torch.no_grad():
        for start in range(0, len(ids), size):
            log_p, state = run.model.log_probs(ids[start:start + size].view(-1, 1), state, run.temperature)
            out.append(log_p[:, 0])  # [n, V]
    return torch.cat(out)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_equal_moglms_in_one_pass_and_in_chunks_that_carry_the_cache(exported, variant):
    run_dir, folder = exported(variant)
    model, tokenizer = load(folder)
    run = moglm.load_run(run_dir)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids  # [1, N]
    assert ids[0].tolist() == run.encode(TEXT).tolist()
    with torch.no_grad():
        whole = model(ids).logits[0]  # [N, V]
        chunks, cache = [], None
        for start in range(0, ids.shape[1], 5):
            out = model(ids[:, start:start + 5], cache=cache, use_cache=True)
            chunks.append(out.logits[0])
            cache = out.cache
    assert whole.dtype == torch.float32 and cache.seen == ids.shape[1]
    torch.testing.assert_close(whole, moglm_chunks(run, ids[0], ids.shape[1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(chunks), moglm_chunks(run, ids[0], 5), atol=1e-5, rtol=0)


def moglm_greedy(run, prompt: str, tokens: int) -> str:
    """``moglm sample`` at temperature 0: only the most likely token is ever drawn (top 1)."""
    return sample(run.model, run.vocab, prompt, tokens, temperature=1.0, top_k=1)


def decoded_like_sample(run, prompt: str, new_ids: list[int]) -> str:
    text = run.vocab.decode(new_ids)
    return (prompt + " " + text).strip() if run.vocab.level == "word" else prompt + text


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_generate_equals_moglm_sample_at_temperature_zero(exported, variant):
    run_dir, folder = exported(variant)
    model, tokenizer = load(folder)
    run = moglm.load_run(run_dir)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    generated = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:]
    assert len(generated) == 12  # a line end does not stop it, as it does not stop moglm sample
    assert decoded_like_sample(run, PROMPT, generated.tolist()) == moglm_greedy(run, PROMPT, 12)


@pytest.mark.parametrize("variant", ["mogrifier", "transformer"])
def test_generate_reads_the_prompt_once_and_then_one_token_per_step(exported, variant):
    model, tokenizer = load(exported(variant)[1])
    read = []
    forward = model.model.forward

    def counting(tokens, state=None):
        read.append(tokens.shape[0])  # tokens [T, B]
        return forward(tokens, state)

    model.model.forward = counting
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    model.generate(ids, max_new_tokens=7, do_sample=False)
    assert read == [ids.shape[1]] + [1] * 6
    read.clear()
    model.generate(ids, max_new_tokens=3, do_sample=False, use_cache=False)  # without the cache: the prefix again
    assert read == [ids.shape[1], ids.shape[1] + 1, ids.shape[1] + 2]


def test_generate_goes_on_from_a_cache_passed_in_and_returns_its_own(exported):
    model, tokenizer = load(exported("mogrifier")[1])
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        read = model(ids[:, :5], use_cache=True).cache  # the first 5 tokens, read once
    plain = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert model.generate(ids, cache=read, max_new_tokens=6, do_sample=False).tolist() == plain.tolist()
    out = model.generate(ids, max_new_tokens=6, do_sample=False, return_dict_in_generate=True)
    assert out.sequences.tolist() == plain.tolist() and out.cache.seen == ids.shape[1] + 5


@pytest.mark.parametrize("variant", ["mogrifier", "mmlstm", "transformer"])
def test_padded_rows_read_only_their_tokens_and_generate_as_alone(exported, variant):
    model, tokenizer = load(exported(variant)[1])
    tokenizer.pad_token = tokenizer.eos_token
    prompts = [PROMPT, "the cat sees the owl .\nthe"]
    for side in ("left", "right"):
        tokenizer.padding_side = side
        batch = tokenizer(prompts, return_tensors="pt", padding=True)
        with torch.no_grad():
            padded = model(**batch).logits  # [2, T, V]
        for b, prompt in enumerate(prompts):
            alone = tokenizer(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                expected = model(alone).logits[0]  # [n, V]
            torch.testing.assert_close(padded[b][batch.attention_mask[b].bool()], expected, atol=1e-5, rtol=0)
    tokenizer.padding_side = "left"
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    together = model.generate(**batch, max_new_tokens=6, do_sample=False)[:, batch.input_ids.shape[1]:]
    for b, prompt in enumerate(prompts):
        alone = tokenizer(prompt, return_tensors="pt").input_ids
        assert together[b].tolist() == model.generate(alone, max_new_tokens=6, do_sample=False)[0, alone.shape[1]:].tolist()


def mogrifier_on_text(exported):
    """The exported tiny Mogrifier, its run, and TEXT's ids ``[1, N]``."""
    run_dir, folder = exported("mogrifier")
    model, tokenizer = load(folder)
    return model, moglm.load_run(run_dir), tokenizer(TEXT, return_tensors="pt").input_ids


def test_labels_give_the_mean_next_token_cross_entropy_and_beam_search_runs(exported):
    model, run, ids = mogrifier_on_text(exported)
    with torch.no_grad():
        loss = model(ids, labels=ids).loss
    assert float(loss) == pytest.approx(run.score(TEXT).xent, abs=1e-5)
    beams = model.generate(ids[:, :6], max_new_tokens=4, num_beams=3, do_sample=False)
    assert beams.shape == (1, 10) and beams[0, :6].tolist() == ids[0, :6].tolist()


def test_the_model_runs_in_float64(exported):
    model, run, ids = mogrifier_on_text(exported)
    with torch.no_grad():
        logits = model.double()(ids).logits[0]
        expected, _ = run.model.double().log_probs(ids[0].view(-1, 1), None, run.temperature)
    assert logits.dtype == torch.float64
    torch.testing.assert_close(logits, expected[:, 0], atol=1e-12, rtol=0)


def test_under_transformers_4_a_parameter_it_would_rename_on_loading_is_refused(exported, monkeypatch):
    """transformers 4 renames checkpoint keys holding "beta" (the MI-LSTM's mi_beta_h) to "bias" on loading."""
    import transformers

    from moglm.export import modeling
    from moglm.export.modeling import MoglmForCausalLM

    config = transformers.AutoConfig.from_pretrained(exported("mi_lstm")[1])
    monkeypatch.setattr(modeling.transformers, "__version__", "4.46.3")  # the module the check reads
    with pytest.raises(ValueError, match="'rnn.mi_beta_h_l0' would be renamed by transformers 4.46.3"):
        MoglmForCausalLM(config)
    MoglmForCausalLM(transformers.AutoConfig.from_pretrained(exported("mogrifier")[1]))  # nothing renamed: loads
