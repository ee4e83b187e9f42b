"""``moglm export RUN OUT``: the files it writes and the model card, ``--force`` (never a user's other files),
``--push-to-hub`` (huggingface_hub's upload, monkeypatched: no network), the runs it refuses in one line, and
loading the export with and without remote code, after ``import moglm`` in either order with transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from conftest import tiny_config, write_tiny_corpus  # noqa: E402

from moglm.cli import main  # noqa: E402
from moglm.export.run import EXPORT_FILES  # noqa: E402

#: what every export holds (transformers 4 adds special_tokens_map.json)
WRITTEN = EXPORT_FILES - {"special_tokens_map.json"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny Mogrifier run, trained and evaluated (results.json), with a dynamic-evaluation report."""
    from moglm.train.trainer import train_and_evaluate

    root = tmp_path_factory.mktemp("export-cli")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MOGLM_CACHE_DIR", str(root / "cache"))
        corpus = write_tiny_corpus(root / "tiny", lines_per_split=(60, 10, 10))
        cfg = tiny_config(corpus, train={"max_steps": 2, "eval_every": 2}, sample={"num_tokens": 0},
                          evaluation={"temperature_tokens": 50})
        train_and_evaluate(cfg, root / "run", progress=False, log=lambda s: None)
    report = {"hyperparameters": {"rule": "rms-rmsdecay", "lr": 0.001, "segment_length": 10},
              "splits": {"test": {"static": {"xent": 1.5, "perplexity": 4.48, "tokens": 40},
                                  "dynamic": {"xent": 1.4, "perplexity": 4.06, "tokens": 40}}}}
    (root / "run" / "dyneval").mkdir(exist_ok=True)
    (root / "run" / "dyneval" / "full.json").write_text(json.dumps(report))
    return root / "run"


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


def test_export_writes_the_model_the_tokenizer_the_card_and_the_remote_code(run, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", str(run), str(out)]) == 0
    assert WRITTEN <= {p.name for p in out.iterdir()} <= EXPORT_FILES
    config = json.loads((out / "config.json").read_text())
    results = json.loads((run / "results.json").read_text())
    assert config["model_type"] == "moglm" and config["architectures"] == ["MoglmForCausalLM"]
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_moglm.MoglmForCausalLM"
    assert config["logit_factor"] == results["temperature"] and config["moglm_model"]["cell"] == {"rounds": 3, "rank": 4}
    assert json.loads((out / "generation_config.json").read_text()).get("eos_token_id") is None
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (out / "moglm_config.toml").read_text() == (run / "config.toml").read_text()
    card = (out / "README.md").read_text()
    meta = card.split("---")[1]
    for line in ("library_name: transformers", "license: apache-2.0", "pipeline_tag: text-generation", "- moglm",
                 "- mogrifier"):
        assert line in meta
    test = results["splits"]["test"]
    assert f"{test['perplexity']:.4f}" in card and f"{test['tokens']:,}" in card  # the run's metrics
    assert "Melis, T. Kočiský, P. Blunsom. *Mogrifier LSTM*. ICLR 2020" in card  # the paper it implements
    assert "Dynamic Evaluation of Neural Sequence Models" in card and "| test, dynamic | 40 |" in card
    assert "Corpus `tiny`, format `word`" in card and "rounds = 3, rank = 4" in card  # its data and config
    assert "exported" in capsys.readouterr().out


def test_an_existing_folder_is_refused_without_force_and_force_replaces_only_the_exports_files(run, tmp_path, capsys):
    out = tmp_path / "out"
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "notes.txt").write_text("mine")
    (out / "README.md").write_text("an old card")
    assert main(["export", str(run), str(out)]) == 1
    assert "exists: give --force" in one_line_error(capsys)
    assert (out / "README.md").read_text() == "an old card"
    assert main(["export", str(run), str(out), "--force"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / ".git" / "HEAD").is_file()
    assert (out / "README.md").read_text() != "an old card" and (out / "model.safetensors").is_file()
    assert WRITTEN | {".git", "notes.txt"} <= {p.name for p in out.iterdir()} <= EXPORT_FILES | {".git", "notes.txt"}


def test_a_file_where_the_folder_should_be_or_the_run_itself_is_a_one_line_error(run, tmp_path, capsys):
    (tmp_path / "out").write_text("a file")
    assert main(["export", str(run), str(tmp_path / "out"), "--force"]) == 1
    assert "is a file" in one_line_error(capsys)
    assert main(["export", str(run), str(run), "--force"]) == 1
    assert "is the run directory itself" in one_line_error(capsys) and not (run / "config.json").exists()


def test_a_music_run_is_refused_in_one_line(tmp_path, capsys):
    music = tmp_path / "music"
    music.mkdir()
    (music / "config.toml").write_text('kind = "music"\nname = "jsb"\n')
    assert main(["export", str(music), str(tmp_path / "out")]) == 1
    assert "is a music run: an RNN-NADE" in one_line_error(capsys) and not (tmp_path / "out").exists()


def test_a_run_without_vocabulary_a_task_run_or_a_folder_that_is_no_run_is_refused_in_one_line(run, tmp_path, capsys):
    started = tmp_path / "started"
    started.mkdir()
    (started / "config.toml").write_text((run / "config.toml").read_text())
    assert main(["export", str(started), str(tmp_path / "out")]) == 1
    assert "no vocabulary (vocab.json)" in one_line_error(capsys)
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 1
    assert "not a run directory" in one_line_error(capsys)
    task = tmp_path / "reverse-copy"
    task.mkdir()
    (task / "config.toml").write_text('architecture = "mogrifier"\nlength = 20\n')
    assert main(["export", str(task), str(tmp_path / "out")]) == 1
    assert "is not a language-model run (its config.toml has no [model] section)" in one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_push_to_hub_uploads_the_export_with_huggingface_hub(run, tmp_path, monkeypatch, capsys):
    import huggingface_hub

    calls = []
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo",
                        lambda self, repo_id, **kw: calls.append(("create", repo_id, kw.get("private"))))

    def upload_folder(self, repo_id, folder_path, **kw):
        calls.append(("upload", repo_id, sorted(p.name for p in __import__("pathlib").Path(folder_path).iterdir())))
        return type("Commit", (), {"commit_url": f"https://huggingface.co/{repo_id}/commit/1"})()

    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    out = tmp_path / "out"
    assert main(["export", str(run), str(out), "--push-to-hub", "someone/tiny-mogrifier", "--private"]) == 0
    assert calls == [("create", "someone/tiny-mogrifier", True),
                     ("upload", "someone/tiny-mogrifier", sorted(p.name for p in out.iterdir()))]
    assert 'from_pretrained("someone/tiny-mogrifier")' in (out / "README.md").read_text()
    assert "pushed to https://huggingface.co/someone/tiny-mogrifier" in capsys.readouterr().out

    def refused(self, repo_id, **kw):
        raise RuntimeError("401 Client Error: Unauthorized for url\nmore detail")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", refused)
    assert main(["export", str(run), str(out), "--force", "--push-to-hub", "someone/x"]) == 1
    assert "--push-to-hub someone/x: 401 Client Error" in one_line_error(capsys)


LOAD = """
import sys
{first}
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]{remote})
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tokenizer("the cat", return_tensors="pt").input_ids
print(type(model).__name__, model.generate(ids, max_new_tokens=3, do_sample=False)[0].tolist())
"""


@pytest.mark.slow
@pytest.mark.parametrize("first, remote", [
    ("import moglm; assert 'transformers' not in sys.modules", ""),  # moglm first: registered on transformers' import
    ("import transformers, moglm", ""),  # transformers first: registered by import moglm
    ("", ", trust_remote_code=True"),  # no moglm import: the remote-code files import it
])
def test_the_export_loads_after_import_moglm_in_either_order_and_with_remote_code(run, tmp_path, first, remote):
    out = tmp_path / "out"
    assert main(["export", str(run), str(out)]) == 0
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", LOAD.format(first=first, remote=remote), str(out)],
                          capture_output=True, text=True, env={**__import__("os").environ, **env}, timeout=300)
    assert done.returncode == 0, done.stderr
    name, ids = done.stdout.split(" ", 1)
    assert name == "MoglmForCausalLM" and len(json.loads(ids)) == 3 + 3  # <eos> the cat, then 3 new tokens


@pytest.mark.slow
def test_without_moglm_or_remote_code_transformers_does_not_know_the_model_type(run, tmp_path):
    out = tmp_path / "out"
    assert main(["export", str(run), str(out)]) == 0
    code = "import sys\nfrom transformers import AutoModelForCausalLM\nAutoModelForCausalLM.from_pretrained(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    assert done.returncode != 0 and "moglm" in done.stderr


def test_without_transformers_the_export_is_a_one_line_error(run, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers raises ImportError
    assert main(["export", str(run), str(tmp_path / "out")]) == 1
    assert "pip install 'moglm[hf]'" in one_line_error(capsys) and not (tmp_path / "out").exists()
