"""Config loading: typed values, overrides, every problem reported at once with the key to change."""

from __future__ import annotations

import pytest
from conftest import ROOT

from loraflow.config import Config, load_config
from loraflow.config.docs import render_markdown
from loraflow.errors import ConfigError


def test_defaults_are_valid():
    assert load_config().problems() == []


def test_overrides_are_typed():
    c = load_config(overrides=["train.max_steps=10", "adapter.target_modules=[q_proj,v_proj]",
                               "train.learning_rate=2e-4", "checkpointing.reentrant=true", "data.eval="])
    assert c.train.max_steps == 10
    assert c.adapter.target_modules == ["q_proj", "v_proj"]
    assert c.train.learning_rate == pytest.approx(2e-4)
    assert c.checkpointing.reentrant == "true"
    assert c.data.eval is None


def test_comma_list_override():
    assert load_config(overrides=["adapter.train_modules=embeddings,norms"]).adapter.train_modules == \
        ["embeddings", "norms"]


def test_unknown_keys_suggest_the_closest_valid_key():
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["trian.max_steps=1", "adapter.rnak=3"])
    text = str(exc.value)
    assert "unknown key `trian`" in text and "Did you mean `train`?" in text
    assert "unknown key `adapter.rnak`" in text and "Did you mean `adapter.rank`?" in text


def test_all_problems_are_reported_at_once(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("adapter:\n  method: lorra\n  rank: -1\ntrain:\n  micro_batch_size: two\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    problems = exc.value.problems
    assert any("adapter.method='lorra'" in p and "Did you mean `lora`" in p for p in problems)
    assert any("train.micro_batch_size='two' must be an integer" in p for p in problems)
    assert any("adapter.rank=-1 must be > 0" in p for p in problems)
    assert str(path) in str(exc.value)


def test_cross_field_problem_names_the_key():
    with pytest.raises(ConfigError, match="adapter.train_modules has no meaning with adapter.method=full"):
        load_config(overrides=["adapter.method=full", "adapter.train_modules=[norms]"])


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_yaml_that_is_not_a_mapping(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(path)


def test_override_without_equals_sign():
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(overrides=["train.max_steps"])


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")) +
                         sorted((ROOT / "src/loraflow/assets/configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    config = load_config(path)
    assert isinstance(config, Config)


def test_shipped_configs_exist():
    assert len(list((ROOT / "examples").glob("*.yaml"))) >= 3
    assert (ROOT / "src/loraflow/assets/configs/sft.yaml").is_file()


def test_configuration_reference_is_current():
    """docs/configuration.md is generated from the schema's docstrings; regenerate with scripts/gen_docs.py."""
    assert (ROOT / "docs/configuration.md").read_text() == render_markdown()


def test_non_finite_numbers_are_refused():
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["train.learning_rate=.nan", "train.epochs=.inf"])
    assert {p.split("=")[0] for p in exc.value.problems} == {"train.learning_rate", "train.epochs"}


def test_yaml_boolean_for_a_string_suggests_quoting():
    with pytest.raises(ConfigError, match="quote the value"):
        load_config(overrides=["output.dir=no"])
