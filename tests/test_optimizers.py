"""The registry table: every entry steps the tiny BERT in fp32 and bf16 and holds exactly its analytic state.

One table: each registered entry x parameter dtype. An entry unavailable here is skipped with its reason.
"""

import copy
import importlib.util
import math

import pytest
import torch

from optbench import optimizers
from optbench.optimizers import Param
from optbench.probes.measure import optimizer_state_bytes
from tests._tiny import entry_step, skip_unavailable, tiny_bert_models

ALL = list(optimizers.REGISTRY.values())
DTYPES = [torch.float32, torch.bfloat16]
# torchao compiles its quantised update on the first step: tens of seconds per entry and dtype on two
# cores. fp32 runs compiled (the path users take) for torchao's own entries; bf16, and HF's names for the same
# classes (adamw_torch_8bit, adamw_torch_4bit: other defaults, the same update), run it eagerly, which creates the
# same state tensors (they are allocated outside the compiled function) at a fraction of the CI time.
SLOW = {s.name for s in ALL if s.library == "torchao"}
COMPILED = {s.name for s in ALL if s.name in SLOW and not s.hf_alias}
# Hand-built shapes: a big matrix, a matrix under bnb's 4096-element threshold, a vector, a 3-D tensor,
# and a size that is not a multiple of the 256-element quantisation block.
SHAPES = [(96, 128), (30, 40), (96,), (4, 32, 48), (5000,)]


@pytest.fixture(scope="module")
def tiny_models():
    return tiny_bert_models(DTYPES)


def _train(model, optimizer, steps: int = 2, spec=None):
    spec = spec or optimizers.resolve("adamw")
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=generator)
        entry_step(spec, optimizer, model(input_ids=ids, labels=torch.tensor([0, 1])).loss, spec.default_lr)


def _cases():
    for spec in ALL:
        for dtype in DTYPES:
            marks = [pytest.mark.slow] if spec.name in SLOW else []
            yield pytest.param(spec, dtype, id=f"{spec.name}-{str(dtype).removeprefix('torch.')}", marks=marks)


@pytest.mark.parametrize("spec,dtype", list(_cases()))
def test_measured_state_on_the_tiny_model_matches_analytic_byte_for_byte(spec, dtype, tiny_models, monkeypatch):
    skip_unavailable(spec)
    if spec.name in SLOW and (dtype != torch.float32 or spec.name not in COMPILED):
        monkeypatch.setattr(torch, "compile", lambda fn, **_: fn)
    model = copy.deepcopy(tiny_models[dtype])
    optimizer = spec.build_for(model, lr=spec.default_lr)
    _train(model, optimizer, spec=spec)
    measured, by_key = optimizer_state_bytes(optimizer)
    facts = spec.analytic_for(model)
    assert measured == facts.state_bytes, by_key
    trainable = sum(p.numel() for p in model.parameters())
    assert facts.trainable_numel == trainable
    assert 0 <= facts.fp32_state_numel <= trainable
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert facts.step_traffic_bytes == 3 * weights + 2 * measured


@pytest.mark.parametrize("spec", [s for s in ALL if not s.structural and s.name not in SLOW and not s.step_in_backward],
                         ids=lambda s: s.name)
def test_bare_parameter_build_matches_the_shapes_only_count(spec):
    """The benchmarks' and estimate's path: `build(params)` and `analytic_state_bytes(shapes)`."""
    skip_unavailable(spec)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s)) for s in SHAPES]
    optimizer = spec.build(params, lr=1e-3)
    for _ in range(2):
        sum((p * p).sum() for p in params).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert optimizer_state_bytes(optimizer)[0] == spec.analytic_state_bytes(SHAPES)


def _numel(model, keep) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if keep(name, p))


@pytest.mark.parametrize("name,dtype,share", [
    ("adamw", torch.float32, lambda m: _numel(m, lambda n, p: True)),
    ("adamw", torch.bfloat16, lambda m: 0),  # torch keeps bf16 moments for bf16 parameters
    ("adamw8bit", torch.bfloat16, lambda m: _numel(m, lambda n, p: p.numel() < 4096)),  # bnb state is fp32
    ("adamw8bit_hf", torch.float32, lambda m: _numel(m, lambda n, p: p.numel() < 4096 or "embeddings." in n
                                                      and n.endswith("embeddings.weight"))),
    ("muon", torch.float32, lambda m: _numel(m, lambda n, p: p.ndim != 2 or "embeddings" in n or "classifier" in n)),
    ("lion_8bit", torch.float32, lambda m: _numel(m, lambda n, p: p.numel() < 4096 or "embeddings." in n
                                                   and n.endswith("embeddings.weight"))),
    ("adafactor", torch.float32, lambda m: _numel(m, lambda n, p: p.ndim == 1)),
])
def test_fp32_state_numel_counts_what_stays_full_precision(name, dtype, share, tiny_models):
    facts = optimizers.resolve(name).analytic_for(tiny_models[dtype])
    assert facts.fp32_state_numel == share(tiny_models[dtype]) > 0 or name == "adamw" and dtype == torch.bfloat16
    assert facts.fp32_state_fraction == facts.fp32_state_numel / facts.trainable_numel


WORD = Param(shape=(30522, 384), name="bert.embeddings.word_embeddings.weight", embedding=True)
HIDDEN = Param(shape=(1536, 384), name="bert.encoder.layer.0.intermediate.dense.weight")
VECTOR = Param(shape=(384,), name="bert.encoder.layer.0.output.LayerNorm.weight")
HEAD = Param(shape=(3, 384), name="classifier.weight", head=True, linear=True)


@pytest.mark.parametrize("name,param,why,bytes_by_dtype", [
    ("adamw8bit", VECTOR, "fp32: under 4096 elements", {"float32": 2 * 4 * 384}),
    ("adamw8bit", WORD, "8-bit", {"uint8": 2 * 30522 * 384, "float32": 2 * 4 * 30522 * 384 // 256}),
    ("adamw8bit_hf", WORD, "fp32: embedding override (HF)", {"float32": 8 * 30522 * 384}),
    ("muon", WORD, "AdamW fallback (embedding)", {"float32": 8 * 30522 * 384 + 4}),
    ("muon", HIDDEN, "Muon momentum", {"float32": 4 * 1536 * 384}),
    # rank-8 moments of the (1536, 8) projected gradient + the 384 x 384 SVD factor the fp32 basis is a view of
    ("galore_adamw_r8", HIDDEN, "low-rank r=8 (projected)", {"float32": 2 * 4 * 1536 * 8 + 4 * 384 * 384}),
    ("galore_adamw_r8", VECTOR, "not projected (vector)", {"float32": 2 * 4 * 384}),
    # HF's names: rank 128 on every nn.Linear weight (the head too); APOLLO's rank is not capped at min(m, n)
    ("galore_adamw", HEAD, "low-rank r=128 (projected)", {"float32": 2 * 4 * 3 * 384 + 4 * 3 * 3}),
    ("apollo_adamw", HEAD, "low-rank r=128 (projected)", {"float32": 2 * 4 * 384 * 128 + 4 * (128 * 3 + 1)}),
    ("galore_adafactor", HIDDEN, "low-rank r=128 (projected)", {"float32": 4 * (1536 + 128) + 4 + 4 * 384 * 384}),
    ("paged_adamw_8bit", WORD, "fp32: embedding override (HF)", {"float32": 8 * 30522 * 384}),
    ("adamw_torch_4bit", HIDDEN, "4-bit", {"uint8": 1536 * 384, "float32": 2 * 4 * (1536 * 384 // 256 + 16) + 4}),
    ("stable_adamw", Param(shape=(4, 4), itemsize=2), "full: 2 moments + Kahan buffer", {"bfloat16": 3 * 2 * 16 + 2}),
    ("adafactor", HIDDEN, "factored (rows + cols)", {"float32": 4 * (1536 + 384) + 4}),
    ("adafactor_momentum", VECTOR, "full (vector) + momentum", {"float32": 4 * 384 * 2 + 4}),
    ("adamw8bit_torchao", Param(shape=(5000,)), "fp32: block size does not divide", {"float32": 8 * 5000 + 4}),
    ("adamw", Param(shape=(4, 4), itemsize=2), "full: 2 moments", {"bfloat16": 2 * 2 * 16, "float32": 4}),
])
def test_each_rule_says_what_a_parameter_gets_and_why(name, param, why, bytes_by_dtype):
    spec = optimizers.resolve(name)
    state = spec.rule(param, **spec.settings({}))
    assert (state.why, state.bytes_by_dtype) == (why, bytes_by_dtype)


def test_the_count_is_the_sum_over_the_map_with_the_shared_qmaps_once():
    spec = optimizers.resolve("adamw8bit")
    state_map = spec.state_map([WORD, HIDDEN, VECTOR])
    assert state_map.shared.bytes_by_dtype == {"float32": 2 * 256 * 4}  # two maps, for all 8-bit tensors
    assert spec.count([WORD, HIDDEN, VECTOR]) == optimizers.Count(
        sum(state.state_bytes for _, state in state_map.params) + 2048, 384)
    assert spec.state_map([VECTOR]).shared is None  # no 8-bit tensor, no maps


def test_muon_orthogonalises_hidden_matrices_and_leaves_the_rest_to_adamw(tiny_models):
    model = copy.deepcopy(tiny_models[torch.float32])
    optimizer = optimizers.resolve("muon").build_for(model)
    muon, adamw = optimizer.parts
    names = {id(p): n for n, p in model.named_parameters()}
    muon_names = [names[id(p)] for g in muon.param_groups for p in g["params"]]
    adamw_names = [names[id(p)] for g in adamw.param_groups for p in g["params"]]
    assert muon_names and all(n.endswith("weight") and "embeddings" not in n for n in muon_names)
    assert "classifier.weight" in adamw_names and "bert.embeddings.word_embeddings.weight" in adamw_names
    assert len(muon_names) + len(adamw_names) == len(list(model.parameters()))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)  # drives both parts
    assert {g["lr"] for part in optimizer.parts for g in part.param_groups} == {0.5 * 5e-5}
    del scheduler


def test_muon_on_cpu_orthogonalises_in_fp32_with_torchs_iteration(tiny_models):
    """On CPU the entry computes Newton–Schulz in fp32 (bf16 products are 12x slower there): the same update
    torch's bf16 Muon makes, to bf16 precision; ns_dtype="bfloat16" keeps torch's own class."""
    from torch.optim import _muon

    grad = torch.randn(48, 160, generator=torch.Generator().manual_seed(0))
    ours = torch_optim_newton_schulz(grad)
    theirs = _muon._zeropower_via_newtonschulz(grad, (3.4445, -4.775, 2.0315), 5, 1e-7).float()
    assert ours.dtype == torch.float32 and torch.allclose(ours, theirs, atol=0.02)
    assert ours.T.shape == torch_optim_newton_schulz(grad.T).shape  # tall matrices are transposed and back
    model = copy.deepcopy(tiny_models[torch.float32])
    entry = optimizers.resolve("muon")
    assert type(entry.build_for(model).parts[0]).__name__ == "Fp32NewtonSchulzMuon"
    assert type(entry.build_for(model, ns_dtype="bfloat16").parts[0]) is torch.optim.Muon
    with pytest.raises(ValueError, match="ns_dtype"):
        entry.build_for(model, ns_dtype="fp8")
    original = _muon._zeropower_via_newtonschulz
    optimizer = entry.build_for(model)
    model(input_ids=torch.ones(2, 8, dtype=torch.long), labels=torch.zeros(2, dtype=torch.long)).loss.backward()
    optimizer.step()
    assert _muon._zeropower_via_newtonschulz is original  # the swap does not outlive the step


def torch_optim_newton_schulz(grad):
    from optbench.optimizers.torch_optim import _newton_schulz

    return _newton_schulz(grad, (3.4445, -4.775, 2.0315), 5, 1e-7, dtype=torch.float32)


def test_adamw8bit_hf_keeps_embeddings_fp32_and_does_not_leak_into_the_pure_one(tiny_models):
    pytest.importorskip("bitsandbytes")
    model = copy.deepcopy(tiny_models[torch.float32])
    hf = optimizers.resolve("adamw8bit_hf").build_for(model)
    _train(model, hf, steps=1)
    word = model.bert.embeddings.word_embeddings.weight
    assert hf.state[word]["state1"].dtype == torch.float32
    pure = optimizers.resolve("adamw8bit").build_for(model)  # same tensors, built after: no override
    _train(model, pure, steps=1)
    assert pure.state[word]["state1"].dtype == torch.uint8


@pytest.mark.parametrize("spec", [s for s in ALL if s.paging.__name__ != "_no_paging"], ids=lambda s: s.name)
def test_paged_entries_say_whether_they_really_page(spec, tiny_models):
    skip_unavailable(spec)
    model = copy.deepcopy(tiny_models[torch.float32])
    optimizer = spec.build_for(model)
    _train(model, optimizer, steps=1)
    paged, reason = spec.paging(optimizer)
    assert paged is False and "CUDA" in reason  # this CPU cannot page; on a GPU the tiny model has >= 1e5 tensors


def test_unpaged_entries_report_none():
    assert optimizers.resolve("adamw").paging(object()) == (None, None)


def test_schedulefree_switches_to_its_averaged_weights_for_evaluation(tiny_models):
    spec = optimizers.resolve("adamw_schedulefree")
    skip_unavailable(spec)
    model = copy.deepcopy(tiny_models[torch.float32])
    optimizer = spec.build_for(model)
    _train(model, optimizer, steps=2)
    training_weights = model.classifier.weight.detach().clone()
    spec.before_eval(optimizer)
    assert not optimizer.param_groups[0]["train_mode"]
    assert not torch.equal(model.classifier.weight, training_weights)  # x (the average) is evaluated, not y
    spec.after_eval(optimizer)
    assert optimizer.param_groups[0]["train_mode"]
    torch.testing.assert_close(model.classifier.weight, training_weights)
    optimizers.resolve("adamw").before_eval(optimizer)  # no-op hooks for every other entry


@pytest.mark.parametrize("name", ["galore_adamw_r8", "apollo_adamw_r8"])
def test_low_rank_entries_take_rank_and_target_modules(name, tiny_models):
    spec = optimizers.resolve(name)
    skip_unavailable(spec)
    model = copy.deepcopy(tiny_models[torch.float32])
    kwargs = {"rank": 4, "target_modules": ["intermediate.dense"]}
    optimizer = spec.build_for(model, **kwargs)
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)  # wraps optimizer.step, as the trial's does
    _train(model, optimizer)
    assert optimizer_state_bytes(optimizer)[0] == spec.analytic_for(model, **kwargs).state_bytes
    projected = model.bert.encoder.layer[0].intermediate.dense.weight  # (256, 64): moments (256, 4)
    assert optimizer.state[projected]["exp_avg"].shape == (256, 4)
    assert optimizer.state[projected]["projection"].numel() == 4 * 64
    assert optimizer.state[model.bert.encoder.layer[0].output.dense.weight]["exp_avg"].shape == (64, 256)


def test_adamw_holds_exactly_eight_bytes_per_param_of_moments():
    params = [torch.nn.Parameter(torch.randn(*s)) for s in SHAPES]
    optimizer = optimizers.resolve("adamw").build(params)
    sum((p * p).sum() for p in params).backward()
    optimizer.step()
    by_key = optimizer_state_bytes(optimizer)[1]
    assert by_key["exp_avg"] + by_key["exp_avg_sq"] == 8 * sum(math.prod(s) for s in SHAPES)
    assert by_key["step"] == 4 * len(SHAPES)


@pytest.mark.parametrize("alias,name", [
    ("adamw_torch", "adamw_torch"), ("sgd", "sgd"), ("adafactor", "adafactor"), ("adamw_bnb_8bit", "adamw8bit_hf"),
    ("adamw_8bit", "adamw8bit_hf"), ("schedule_free_adamw", "adamw_schedulefree"), ("ADAMW", "adamw"),
    ("galore_adamw", "galore_adamw"), ("adafactor_hf", "adafactor"),
])
def test_hf_trainer_names_resolve_to_what_hf_builds(alias, name):
    assert optimizers.resolve(alias).name == name


def test_every_hf_alias_is_one_of_transformers_optimizer_names():
    from transformers.training_args import OptimizerNames

    hf_names = {o.value for o in OptimizerNames}
    assert {s.hf_alias for s in ALL if s.hf_alias} <= hf_names
    assert optimizers.resolve("adamw_fused").default_kwargs == {"fused": True}


def test_every_transformers_optimizer_name_is_listed_here():
    """Fails the day transformers adds an `optim` name: give it an entry (runnable, or with its reason)."""
    from transformers.training_args import OptimizerNames

    known = {name for spec in ALL for name in spec.names}
    assert sorted(o.value for o in OptimizerNames if o.value not in known) == []


def test_the_benchmark_default_holds_the_default_optimizers_and_one_entry_per_library():
    chosen = [optimizers.resolve(name) for name in optimizers.representatives()]
    assert [s.name for s in chosen[:3]] == list(optimizers.DEFAULT_OPTIMIZERS)
    assert len({s.library for s in chosen}) == len(chosen) == len({s.library for s in ALL})


def test_fused_alias_really_builds_the_fused_kernel():
    optimizer = optimizers.resolve("adamw_torch_fused").build([torch.nn.Parameter(torch.zeros(3))])
    assert optimizer.param_groups[0]["fused"] is True


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(optimizers.UnknownOptimizerError, match="adamw8bit") as info:
        optimizers.resolve("sgdx")
    assert "sgdx" in str(info.value) and "adamw_bnb_8bit" in str(info.value)


def test_missing_library_makes_an_entry_unavailable_with_the_extra_to_install():
    spec = optimizers.OptimizerSpec(
        name="ghost", factory=lambda p, lr: None, library="no_such_library_xyz", extra="ghost", default_lr=1e-3,
        lr_range=(1e-4, 1e-2), precision="fp32", rule=lambda p: optimizers.ParamState({}, "none"))
    assert not spec.available
    assert spec.unavailable_reason() == 'needs `pip install "optbench[ghost]"`'


def test_an_entry_that_cannot_run_here_stays_registered_with_its_reason():
    spec = optimizers.resolve("adam_mini")
    assert not spec.available
    # Not installed (`all` leaves it out): the extra to install; installed: why it still cannot run here.
    reason = spec.unavailable_reason()
    assert "IndexError" in reason if importlib.util.find_spec("adam_mini") else 'optbench[adam-mini]' in reason


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.name)
def test_lr_grid_is_log_spaced_inside_the_range_and_holds_the_default(spec):
    low, high = spec.lr_range
    assert low < spec.default_lr < high
    grid = spec.lr_grid(5)
    assert len(grid) == 5 and grid == sorted(grid) and spec.default_lr in grid
    assert low <= grid[0] and grid[-1] <= high
    ratios = [b / a for a, b in zip(grid, grid[1:], strict=False)]
    assert all(r > 1.5 for r in ratios)  # spread over the range, not bunched up
    assert spec.lr_grid(1) == [spec.default_lr]


def test_nominal_bytes_per_param_comes_from_the_analytic_count():
    assert optimizers.resolve("adamw").nominal_bytes_per_param == pytest.approx(8.0, abs=1e-5)
    assert optimizers.resolve("adamw8bit").nominal_bytes_per_param == pytest.approx(2 + 8 / 256, abs=1e-2)
    assert optimizers.resolve("adafactor").nominal_bytes_per_param < 0.01


def test_kwargs_parser_resolves_aliases_and_turns_lists_into_tuples():
    parsed = optimizers.parse_optimizer_kwargs(['adamw_bnb_8bit={"betas": [0.9, 0.95]}', 'adamw8bit_hf={"eps": 1e-6}',
                                                "adafactor={}"])
    assert parsed == {"adamw8bit_hf": {"betas": (0.9, 0.95), "eps": 1e-6}, "adafactor": {}}


@pytest.mark.parametrize("item,message", [
    ("adamw", "NAME="), ('={"a": 1}', "NAME="), ("adamw={betas: 1}", "not valid JSON"),
    ("adamw=[1, 2]", "JSON object"), ('sgdx={"a": 1}', "unknown optimizer"),
])
def test_kwargs_parser_rejects_malformed_items(item, message):
    with pytest.raises(ValueError, match=message):
        optimizers.parse_optimizer_kwargs([item])


@pytest.mark.parametrize("version,old,new", [(2, "sgd", "sgd_momentum"), (1, "galore_adamw", "galore_adamw_r8"),
                                             (2, "apollo_adamw", "apollo_adamw_r8"), (3, "sgd", "sgd")])
def test_records_from_before_hf_names_took_their_meaning_read_under_the_new_names(version, old, new):
    from optbench.records.record import Record

    assert Record.from_dict({"schema_version": version, "trial_id": "t", "optimizer": old}).optimizer == new
    assert optimizers.resolve(new).name == new
