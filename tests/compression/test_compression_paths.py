"""The recurrence's path that a compressed file records (moglm.compression.paths, container version 12): the
encoder's path is pinned for every step and recorded, the decoder takes it whatever its own machine would choose,
and a path this machine cannot run, or a forged one, is a one-line error."""

from __future__ import annotations

import pytest

pytest.importorskip("constriction", reason="the compress extra (constriction) is not installed")

from conftest import coded_round_trip, tiny_format_run  # noqa: E402
import torch  # noqa: E402

from moglm.compression import compress, container, decompress, paths, read_header  # noqa: E402
from moglm.recurrence.compiled.routes import gemm_route, route_name  # noqa: E402
from moglm.errors import MoglmError  # noqa: E402
from moglm.recurrence import auto, compiled  # noqa: E402

needs_compiled = pytest.mark.skipif(not compiled.available(), reason="the compiled recurrence cannot be built here")
TEXT = b"Each step of the coder takes the path its header names,\nwhatever this machine would choose.\n" * 3


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    return tiny_format_run(tmp_path_factory.mktemp("byte"), "byte", hidden_size=16)


def _trained(run):
    from moglm.runs.language_model import load_run

    return load_run(run)


@needs_compiled
@pytest.mark.parametrize("coded, decoding", [("fused", "compiled"), ("compiled", "fused")])
def test_a_file_decodes_on_the_path_its_header_records_whatever_this_machine_would_choose(byte_run, monkeypatch,
                                                                                          coded, decoding):
    """Coded where ``auto`` chose one path (forced here by the variable), decoded where it would choose the other:
    every layer of every decoding step takes the recorded one, so the file round-trips."""
    trained = _trained(byte_run)
    monkeypatch.setenv("MOGLM_AUTO_BACKEND", coded)
    blob, _ = compress(TEXT, trained.model, trained.vocab, factor=trained.temperature, block_size=64, progress=False)
    path = read_header(blob)[0]["path"]
    # a compiled choice forced by the variable has no route of its own: the machine's is recorded, not left open
    assert path == {"backend": coded, "route": route_name(gemm_route(torch.float32)) if coded == "compiled" else None,
                    "weight_gradient_route": None}  # nothing adapts: no backward runs
    monkeypatch.setenv("MOGLM_AUTO_BACKEND", decoding)
    with auto.recording() as seen:
        assert decompress(blob, trained.model, trained.vocab, progress=False) == TEXT
    assert seen and all(choice == {"backend": coded, "route": path["route"]} for choice in seen)


@needs_compiled
def test_an_adapting_file_records_its_weight_gradient_route_and_decodes_on_it_whatever_this_machine_probed(
        byte_run, monkeypatch):
    """The compiled backward's weight-gradient products take the route the header records, not the one this
    machine's probe stored (set to the other one here before decoding)."""
    from moglm.dynamic_evaluation import DynamicEvaluator, Hyperparameters
    from moglm.recurrence.compiled import routes

    trained = _trained(byte_run)
    hp = Hyperparameters(rule="sgd", lr=0.3, segment_length=5)
    monkeypatch.setenv("MOGLM_AUTO_BACKEND", "compiled")

    def adapter(header=None):
        return DynamicEvaluator(trained.model, hp, factor=trained.temperature)

    blob, _ = compress(TEXT, trained.model, trained.vocab, factor=trained.temperature, adapter=adapter(),
                       settings={"hyperparameters": hp.as_dict()}, block_size=64, progress=False)
    recorded = read_header(blob)[0]["path"]["weight_gradient_route"]
    assert recorded == route_name(routes.weight_gradient_route(torch.float32))
    other = "aten" if recorded == "brgemm" else "brgemm"
    monkeypatch.setitem(routes._weight_gradient_routes, torch.float32, (routes.route_code(other), {}))
    taken, real = [], routes.weight_gradient_route

    def spy(dtype):
        taken.append(route_name(real(dtype)))
        return real(dtype)

    monkeypatch.setattr(routes, "weight_gradient_route", spy)
    assert decompress(blob, trained.model, trained.vocab, progress=False, adapter_for=adapter) == TEXT
    assert taken and set(taken) == {recorded} and route_name(real(torch.float32)) == other  # the pin ended


@needs_compiled
def test_the_encoders_steps_all_take_the_path_its_first_step_chose(byte_run, monkeypatch):
    """The encoder pins what its first layer's choice was for every later step (here the variable would say
    otherwise half way through, and is not read)."""
    trained = _trained(byte_run)
    monkeypatch.setenv("MOGLM_AUTO_BACKEND", "fused")
    real = paths.coding_path

    def then_compiled(*args):
        path = real(*args)
        monkeypatch.setenv("MOGLM_AUTO_BACKEND", "compiled")  # what an unpinned step would now take
        return path

    monkeypatch.setattr(container, "coding_path", then_compiled)
    with auto.recording() as seen:
        blob, _ = compress(TEXT, trained.model, trained.vocab, factor=trained.temperature, block_size=64,
                           progress=False)
    assert read_header(blob)[0]["path"] == {"backend": "fused", "route": None, "weight_gradient_route": None}
    assert len(seen) > 2 and all(choice["backend"] == "fused" for choice in seen)


def test_the_header_records_the_path_autos_own_choice_took(byte_run, fresh_choice_store):
    """With ``auto`` probing (into a fresh store), the header names the path and, for the compiled window, the
    route its probe chose for the coder's steps."""
    blob, _ = coded_round_trip(byte_run, TEXT)
    path = read_header(blob)[0]["path"]
    assert path == paths.recorded_path({"path": path}) and path["backend"] in paths.BACKENDS
    assert (path["route"] is not None) == (path["backend"] == "compiled")


def test_where_no_layer_chooses_the_path_is_the_fused_window_without_the_compiled_one_and_none_with_it(monkeypatch):
    def no_choice(tokens, state):  # a model whose layers run their reference loop: auto is never asked
        return tokens, state

    monkeypatch.setattr(paths.compiled, "available", lambda: False)
    assert paths.coding_path([no_choice], 3, 0) == {"backend": "fused", "route": None, "weight_gradient_route": None}
    monkeypatch.setattr(paths.compiled, "available", lambda: True)
    assert paths.coding_path([no_choice], 3, 0) is None


def test_a_compiled_path_where_the_library_cannot_be_built_is_a_one_line_error(byte_run, monkeypatch):
    trained = _trained(byte_run)
    blob, _ = compress(TEXT, trained.model, trained.vocab, factor=trained.temperature, block_size=64, progress=False)
    header = read_header(blob)[0]
    if header["path"]["backend"] != "compiled":
        pytest.skip("coded on the fused window here")
    monkeypatch.setattr(paths.compiled, "available", lambda: False)
    monkeypatch.setattr(paths.compiled, "unavailable_reason", lambda: "no compiler")
    with pytest.raises(MoglmError, match=r"^f\.moglm was coded with moglm's compiled recurrence, which cannot be "
                                         r"built here \(no compiler\): decompress it where it builds$"):
        decompress(blob, trained.model, trained.vocab, name="f.moglm", progress=False)
    paths.check_path({"backend": "fused", "route": None, "weight_gradient_route": None})  # it runs anywhere
    paths.check_path(None)


@needs_compiled
def test_a_file_of_raw_blocks_without_adaptation_decodes_without_the_recurrence_it_was_coded_on(byte_run,
                                                                                               monkeypatch):
    """Every block stored raw, nothing adapting: the model's predictions decide nothing, so a compiled path the
    machine cannot run is no reason to refuse the file (an empty file is one such)."""
    import numpy as np

    trained = _trained(byte_run)
    noise = bytes(np.random.default_rng(6).integers(0, 256, 700, dtype=np.uint8))
    coded = [compress(data, trained.model, trained.vocab, factor=trained.temperature, block_size=64, progress=False)
             for data in (noise, b"")]
    assert all(report.raw_blocks == report.blocks and read_header(blob)[0]["path"]["backend"] == "compiled"
               for blob, report in coded)
    monkeypatch.setattr(paths.compiled, "available", lambda: False)
    for data, (blob, _) in zip((noise, b""), coded):
        assert decompress(blob, trained.model, trained.vocab, progress=False) == data
    coded_text = compress(TEXT, trained.model, trained.vocab, factor=trained.temperature, progress=False)[0]
    with pytest.raises(MoglmError, match="coded with moglm's compiled recurrence"):  # a coded block: refused
        decompress(coded_text, trained.model, trained.vocab, progress=False)


@pytest.mark.parametrize("path", [
    {"backend": "gpu", "route": None, "weight_gradient_route": None},
    {"backend": "compiled", "route": "abacus", "weight_gradient_route": None},
    {"backend": "compiled", "route": "brgemm", "weight_gradient_route": "abacus"},
    {"backend": "fused", "route": "brgemm", "weight_gradient_route": None},
    {"backend": "fused", "route": None, "weight_gradient_route": "aten"},
    {"backend": "compiled", "route": "brgemm"}, {"backend": "compiled", "route": 3, "weight_gradient_route": None},
    ["compiled"]])
def test_a_recorded_path_that_is_not_one_is_a_one_line_error(path):
    with pytest.raises(MoglmError, match="its header's recurrence path is not one this moglm runs"):
        paths.recorded_path({"path": path}, "f")


def test_a_file_before_version_12_records_no_path_and_decodes_with_autos_own_choice():
    assert paths.recorded_path({}) is None and paths.recorded_path({"path": None}) is None
    path = {"backend": "compiled", "route": "brgemm:panels", "weight_gradient_route": "aten"}
    assert paths.recorded_path({"path": path}) == path
