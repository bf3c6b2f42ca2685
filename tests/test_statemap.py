"""The state map: each registry entry's per-parameter rule against the state a real step creates, and the
`optbench explain` text built from it.

One table again: every entry x parameter dtype on the tiny BERT, analytic map == measured map parameter by
parameter and dtype by dtype. An entry unavailable here is skipped with its reason.
"""

import copy

import pytest
import torch
import transformers

from optbench import optimizers
from optbench.memory.statemap import (
    SHARED,
    StateRow,
    analytic_state_map,
    bytes_by_module,
    explain,
    explain_model,
    group_rows,
    measured_state_map,
    module_kind,
    render_explain,
    write_state_map,
)
from optbench.optimizers import Param
from optbench.probes.measure import optimizer_state_bytes
from optbench.workloads import WorkloadError, minilm_path
from tests._tiny import entry_step, skip_unavailable, tiny_bert_models

ALL = list(optimizers.REGISTRY.values())
DTYPES = [torch.float32, torch.bfloat16]
TORCHAO = {s.name for s in ALL if s.library == "torchao"}


@pytest.fixture(scope="module")
def tiny_models():
    return tiny_bert_models(DTYPES)


def _random_step(model, optimizer, spec=None):
    """One real step on seeded random gradients: creates every state tensor, no forward pass needed. An entry that
    updates inside backward (layer-wise, LOMO) gets one forward/backward instead: its hooks do the step."""
    if spec is not None and spec.step_in_backward:
        ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
        entry_step(spec, optimizer, model(input_ids=ids, labels=torch.tensor([0, 1])).loss, spec.default_lr)
        return
    generator = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=generator).to(p.dtype)
    optimizer.step()


def _bytes(rows):
    return [(row.name, row.module_kind, row.state_bytes_by_dtype) for row in rows]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.name)
def test_analytic_map_equals_the_measured_map_parameter_by_parameter(spec, dtype, tiny_models, monkeypatch):
    skip_unavailable(spec)
    if spec.name in TORCHAO:  # the same state tensors, without tens of seconds of compilation
        monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    model = copy.deepcopy(tiny_models[dtype])
    optimizer = spec.build_for(model)
    _random_step(model, optimizer, spec)
    analytic, measured = analytic_state_map(spec, model), measured_state_map(optimizer, model)
    assert _bytes(analytic) == _bytes(measured)
    total = sum(row.state_bytes for row in measured)
    assert total == optimizer_state_bytes(optimizer)[0] == spec.analytic_for(model).state_bytes
    assert sum(bytes_by_module(analytic).values()) == total
    assert sum(row.fp32_state_numel for row in analytic) == spec.analytic_for(model).fp32_state_numel


def test_one_8bit_tensor_still_puts_the_quantisation_maps_on_the_shared_row():
    """bitsandbytes keeps its qmaps on the optimizer (name2qmap) as well as in each 8-bit tensor's state: with a
    single 8-bit tensor they are still the optimizer's, not that parameter's."""
    pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 128)  # weight: 8192 elements, 8-bit; bias: 128, fp32
    optimizer = optimizers.resolve("adamw8bit").build_for(model)
    _random_step(model, optimizer)
    measured = measured_state_map(optimizer, model)
    weight, bias, shared = measured
    assert weight.state_bytes_by_dtype == {"uint8": 2 * 8192, "float32": 2 * 4 * 8192 // 256}
    assert bias.state_bytes_by_dtype == {"float32": 2 * 4 * 128}
    assert (shared.name, shared.module_kind, shared.state_bytes_by_dtype) == ("(shared)", SHARED, {"float32": 2048})
    assert "qmap1" in shared.why and "qmap2" in shared.why
    assert _bytes(analytic_state_map("adamw8bit", model)) == _bytes(measured)
    assert bytes_by_module(measured) == {"embeddings": 0, "attention": 0, "mlp": 16384 + 256,
                                         "norms/biases": 1024, "head": 0, "shared": 2048}
    assert [row.name for row in analytic_state_map("adamw", model)] == ["weight", "bias"]  # no shared row


@pytest.mark.parametrize("name,kind", [
    ("bert.embeddings.word_embeddings.weight", "embeddings"),
    ("bert.embeddings.LayerNorm.bias", "embeddings"),
    ("bert.encoder.layer.3.attention.self.query.weight", "attention"),
    ("bert.encoder.layer.3.attention.output.dense.weight", "attention"),
    ("bert.encoder.layer.3.attention.self.query.bias", "norms/biases"),
    ("bert.encoder.layer.3.attention.output.LayerNorm.weight", "norms/biases"),
    ("bert.encoder.layer.3.intermediate.dense.weight", "mlp"),
    ("bert.encoder.layer.3.output.dense.weight", "mlp"),
    ("bert.encoder.layer.3.output.LayerNorm.weight", "norms/biases"),
    ("bert.pooler.dense.weight", "head"),
    ("classifier.bias", "head"),
    ("model.embed_tokens.weight", "embeddings"),
    ("model.layers.0.self_attn.q_proj.weight", "attention"),
    ("model.layers.0.mlp.down_proj.weight", "mlp"),
    ("model.layers.0.input_layernorm.weight", "norms/biases"),
    ("model.norm.weight", "norms/biases"),
    ("lm_head.weight", "head"),
])
def test_module_kind_from_bert_and_llama_names(name, kind):
    assert module_kind(name) == kind


def test_module_kind_reads_the_structural_facts_when_given():
    assert module_kind("wordvecs", Param(shape=(100, 8), embedding=True)) == "embeddings"
    assert module_kind("out", Param(shape=(3, 8), head=True)) == "head"
    assert module_kind("blocks.0.mix.scale", Param(shape=(8,))) == "norms/biases"  # a vector, whatever its name
    assert module_kind("blocks.0.mix.scale", Param(shape=(8, 8))) == "mlp"


def test_module_kinds_of_the_lm_workloads_llama_built_on_the_meta_device():
    model = explain_model(workload="lm")
    assert type(model).__name__ == "LlamaForCausalLM" and next(model.parameters()).device.type == "meta"
    by_module = bytes_by_module(analytic_state_map("adamw", model))
    # AdamW: 8 bytes per element + a 4-byte step per tensor; untied 1,024 x 512 embedding and head (the Markov
    # corpus's token ids).
    assert by_module["embeddings"] == by_module["head"] == 8 * 1024 * 512 + 4
    assert by_module["attention"] == 4 * 4 * (8 * 512 * 512 + 4)  # 4 layers x q, k, v, o
    assert by_module["norms/biases"] == 9 * (8 * 512 + 4)  # 2 norms per layer + the final one
    assert by_module["shared"] == 0


def _row(name, why="8-bit", bytes_by_dtype=None, kind="attention", shape=(384, 384), fp32=0):
    return StateRow(name, shape, 384 * 384 if len(shape) == 2 else shape[0], kind,
                    bytes_by_dtype or {"uint8": 2 * 147456, "float32": 4608}, why, fp32)


def test_identical_layers_collapse_into_one_line_and_a_different_rule_splits_them():
    rows = [_row(f"enc.layer.{i}.attn.q.weight") for i in range(6)]
    rows[5] = _row("enc.layer.5.attn.q.weight", why="fp32: embedding override (HF)", bytes_by_dtype={"float32": 8})
    grouped = group_rows(rows)
    assert [(row.name, count) for row, count in grouped] == [("enc.layer.*.attn.q.weight", 5),
                                                             ("enc.layer.5.attn.q.weight", 1)]


def test_rendered_lines_fit_120_characters_and_end_with_total_and_answer():
    long_name = "encoder." + ".".join(f"block{i}" for i in range(20)) + ".weight"
    rows = [_row(long_name), _row("embed.weight", why="fp32: under 4096 elements", kind="embeddings",
                                  bytes_by_dtype={"float32": 8 * 147456}, fp32=147456)]
    lines = render_explain(rows, title="t" * 200).splitlines()
    assert max(map(len, lines)) <= 120
    assert any(line.lstrip().startswith("…") for line in lines)  # the long name is cut from the left
    # 2 x 147,456 uint8 + 4,608 absmax bytes, and 8 x 147,456 fp32 bytes, over 2 x 147,456 params.
    assert lines[-2] == "total: 294,912 params, 1,479,168 state bytes (1.41 MiB), 5.0156 bytes/param"
    assert lines[-1] == "full-size fp32 state: 50 % of params: embeddings 100 %; mostly embed.weight"


def test_state_map_csv_has_one_line_per_row_with_bytes_per_dtype(tmp_path):
    pd = pytest.importorskip("pandas")
    rows = [_row("a.weight"), StateRow("(shared)", (), 0, SHARED, {"float32": 2048}, "8-bit quantisation maps")]
    table = pd.read_csv(write_state_map(rows, tmp_path / "deep" / "state_map.csv"))
    assert list(table["name"]) == ["a.weight", "(shared)"]
    assert list(table["state_bytes"]) == [2 * 147456 + 4608, 2048]
    assert list(table["state_bytes_uint8"]) == [2 * 147456, 0]
    assert list(table["state_dtypes"]) == ["uint8+fp32", "fp32"]
    assert table.loc[0, "shape"] == "384x384" and table.loc[0, "why"] == "8-bit"


@pytest.fixture(scope="module")
def meta_minilm():
    return explain_model()


def test_explain_adamw8bit_hf_shows_the_word_embedding_fp32_and_the_layers_8bit(meta_minilm):
    lines = explain("adamw_bnb_8bit").splitlines()  # HF's name resolves to the entry
    assert max(map(len, lines)) <= 120
    word = next(line for line in lines if "embeddings.word_embeddings.weight" in line)
    assert " fp32 " in word and "embedding override" in word
    query = next(line for line in lines if "encoder.layer.*.attention.self.query.weight x6" in line)
    assert " uint8+fp32 " in query and query.endswith("8-bit")
    assert any(line.lstrip().startswith("classifier.weight") for line in lines)
    analytic = optimizers.resolve("adamw8bit_hf").analytic_for(meta_minilm).state_bytes
    assert f" {analytic:,} state bytes" in lines[-2]
    # fp32: all 11.9 M embedding elements (word and position by the override, the rest under 4096 elements)
    # and every vector: 52.6 % of MiniLM's 22.7 M, 99.7 % of it in the embeddings.
    assert lines[-1].startswith("full-size fp32 state: 52.6 % of params: embeddings 99.7 %")


@pytest.mark.parametrize("name, share", [("lomo", "none"), ("adafactor", "0.089 % of params")])
def test_an_optimizer_that_saves_memory_is_not_asked_why_it_saves_none(name, share):
    """The last line read "why no memory saving? no parameter keeps full-size fp32 state" for LoMo (no state at
    all), and asked the same of Adafactor (factored; full state only for its vectors): a question that was false
    for both. It states the share as a fact."""
    last = explain(name, workload="tiny").splitlines()[-1]
    assert last.startswith(f"full-size fp32 state: {share}") and "why no memory saving" not in last


def test_an_empty_map_renders_one_line():
    assert render_explain([], title="sgd on nothing") == "sgd on nothing\nno trainable parameters: no optimizer state"


def test_explain_needs_no_optimizer_library():
    """adam_mini cannot run here (not installed, or broken on BERT): its map is arithmetic all the same."""
    text = explain("adam_mini", workload="tiny")
    assert "fp32 momentum + 1 v per row" in text and "total: " in text


@pytest.mark.parametrize("call,message", [
    (lambda: explain_model(model="/no/such/model"), "--workload minilm"),
    (lambda: explain_model(workload="nope"), "known: minilm"),
    (lambda: explain("sgdx"), "unknown optimizer 'sgdx'"),
])
def test_explain_errors_are_one_line_value_errors(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


def test_a_model_that_is_not_there_names_the_offline_default():
    with pytest.raises(WorkloadError, match="not a local model folder"):
        explain_model(model="no-such-org/no-such-model")


@pytest.fixture(scope="module")
def minilm():
    """What a default-job trial trains: the shipped MiniLM with a 3-label head."""
    torch.manual_seed(0)
    return transformers.AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=3)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["adamw8bit_hf", "muon", "galore_adamw_r8"])
def test_meta_device_explain_total_equals_the_state_of_a_real_minilm_step(name, minilm, meta_minilm):
    spec = optimizers.resolve(name)
    skip_unavailable(spec)
    assert next(meta_minilm.parameters()).device.type == "meta"
    meta_rows = analytic_state_map(spec, meta_minilm)
    model = copy.deepcopy(minilm)
    optimizer = spec.build_for(model)
    _random_step(model, optimizer)
    measured = measured_state_map(optimizer, model)
    assert _bytes(meta_rows) == _bytes(measured)
    assert sum(row.state_bytes for row in meta_rows) == optimizer_state_bytes(optimizer)[0]
