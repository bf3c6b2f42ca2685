"""The one meta-device builder (`Workload.meta_model` over `workloads.on_meta_device`): what the peak predictor
(memory/predict.py), `optbench explain` (memory/statemap.py) and `optbench estimate --model` (memory/estimate.py)
build agrees with each other and with the model the workload's `build` really trains: the same parameter names,
shapes and dtypes, so every memory answer is about the model a trial trains."""

import pytest

from optbench.job.spec import TrialSpec
from optbench.memory import estimate, predict
from optbench.memory.statemap import explain_model
from optbench.workloads import WORKLOADS, WorkloadError, get_workload, minilm_path, model_name_for_source


def _layout(model):
    """(name, shape, dtype) of each trainable parameter, in the model's order."""
    return [(name, tuple(p.shape), p.dtype) for name, p in model.named_parameters() if p.requires_grad]


def _facts(facts):
    """The same from the predictor's facts (which keep the element size, not the dtype)."""
    return [(p.name, tuple(p.shape), p.itemsize) for p in facts.params]


def _trained(spec):
    built = get_workload(spec.workload).build(spec)
    return built.model, predict.ModelFacts.from_model(built.model, built.model_name)


@pytest.mark.parametrize("workload", list(WORKLOADS))  # a workload added without its meta model fails here
def test_predict_and_explain_build_the_model_a_trial_trains(workload):
    model = str(minilm_path()) if get_workload(workload).needs_model else None  # "custom": a --model of its own
    spec = TrialSpec(optimizer="adamw", workload=workload, model=model, seq_len=16, eval_size=16)
    trained, trained_facts = _trained(spec)
    explained = explain_model(workload, model)
    assert {p.device.type for p in explained.parameters()} == {"meta"}  # no memory, no weights read
    assert _layout(explained) == _layout(trained)
    predicted = predict.facts_for_spec(spec)
    assert predicted.name == trained_facts.name and _facts(predicted) == _facts(trained_facts)
    assert predicted.arch == trained_facts.arch


def test_estimate_of_the_shipped_model_with_the_tasks_head_is_the_default_jobs_model():
    """`estimate --model <MiniLM folder> --num-labels 3` counts what the default job trains, under the name the
    default job's records (and calibrations) carry."""
    spec = TrialSpec(optimizer="adamw", workload="minilm", seq_len=16, eval_size=16)
    _, trained_facts = _trained(spec)
    size = estimate.size_from_model(minilm_path(), num_labels=3)
    assert size.facts.name == trained_facts.name == model_name_for_source(minilm_path())
    assert _facts(size.facts) == _facts(trained_facts)
    assert size.num_params == sum(p.numel for p in trained_facts.params)


def test_a_model_folder_no_workload_ships_is_named_by_its_path(tmp_path):
    assert model_name_for_source(str(tmp_path)) == str(tmp_path)


def test_a_config_that_cannot_be_built_is_one_line_naming_what_to_give(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "bert", "hidden_size": 30, "num_attention_heads": 4}')
    with pytest.raises(WorkloadError, match="cannot build model") as info:
        explain_model(model=str(tmp_path))  # 30 is not a multiple of 4 heads: transformers refuses the config
    assert "\n" not in str(info.value) and "--workload minilm" in str(info.value)


@pytest.mark.parametrize("config, says", [
    ("{bad", "is not a valid JSON file"),
    ('{"model_type": "nosuch"}', "does not recognize this architecture"),
    ('{"model_type": "bert", "hidden_size": -4, "num_attention_heads": 1}', "negative dimension"),
])
def test_a_folder_whose_config_is_broken_says_what_is_wrong_with_it(tmp_path, config, says):
    """A folder with a malformed config.json (or an unknown model_type) was called "not a local model folder",
    though it is one; a negative hidden_size ended explain and estimate in a RuntimeError traceback."""
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(WorkloadError, match=says) as info:
        explain_model(model=str(tmp_path))
    assert "\n" not in str(info.value) and "not a local model folder" not in str(info.value)
