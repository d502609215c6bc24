"""The vLLM plug-in's settings (``additional_config["adaptspec"]``, adaptspec.vllm.config), without vLLM:
every bad value is one line naming its ``adaptspec`` key in the entry's own words (no command-line
option, no numpy repr), and the good ones are read as written."""

from __future__ import annotations

import pytest

from adaptspec.errors import AdaptspecError
from adaptspec.vllm.config import plugin_settings

TWO = {"A": "fixed:2", "B": "fixed:4"}


@pytest.mark.parametrize(
    "entry, key",
    [
        ({"seed": -5}, "seed"),
        ({"decide_timeout": float("inf")}, "decide_timeout"),
        ({"decide_timeout": float("nan")}, "decide_timeout"),
        ({"decide_timeout": 2.0}, "decide_timeout"),  # a decision holds vLLM's step up to this long
        ({"feedback_timeout": float("inf")}, "feedback_timeout"),
        ({"checkpoint_interval": float("inf")}, "checkpoint_interval"),
        ({"sync_interval": float("inf")}, "sync_interval"),
        ({"lease_ttl": float("inf")}, "lease_ttl"),
        ({"load_prior": float("nan")}, "load_prior"),
        ({"log_dir": ""}, "log_dir"),  # once: the working directory
        ({"checkpoint_dir": "  "}, "checkpoint_dir"),
        ({"latency": ""}, "latency"),  # once: the default profile, silently
        ({"latency": "no-such-profile"}, "latency"),
        ({"featurizer": ""}, "featurizer"),
        ({"shared": ""}, "shared"),
        ({"replica_id": ""}, "replica_id"),
        ({"reward": "nope"}, "reward"),
        ({"reward": "modelled"}, "reward"),  # needs latency
        ({"variants": {"A": ""}}, "variants"),  # once: "--variant 'A='"
        ({"variants": {"": "fixed:2"}}, "variants"),
        ({"variants": {}}, "variants"),
        ({"variants": TWO, "split": "-1,2"}, "split"),  # once: "[np.float64(-1.0), np.float64(2.0)]"
        ({"variants": TWO, "split": "0,0"}, "split"),
        ({"variants": TWO, "split": "inf,1"}, "split"),
        ({"variants": TWO, "split": "a,b"}, "split"),  # once: "--split: expected weights"
        ({"variants": TWO, "split": "1,2,3"}, "split"),
        ({"split": "1"}, "split"),
        ({"load_rule": "sometimes"}, "load_rule"),  # once: "--load-rule 'sometimes'"
        ({"load_rule": "fixed:0"}, "load_rule"),
        ({"load_rule": "table:1=2,x=3"}, "load_rule"),
        ({"load_rule": "table:"}, "load_rule"),
        ({"arms": [0, 2]}, "arms"),
        ({"roll_rows": 0}, "roll_rows"),
    ],
)
def test_a_bad_value_is_one_line_naming_its_key_in_the_entrys_words(entry, key):
    with pytest.raises(AdaptspecError) as e:
        plugin_settings({"adaptspec": entry})
    msg = str(e.value)
    assert msg.startswith(f"additional_config adaptspec.{key}"), msg
    assert "\n" not in msg and "--" not in msg and "np." not in msg, msg


def test_a_featurizer_folder_without_a_featurizer_is_refused(tmp_path):
    with pytest.raises(
        AdaptspecError, match=r"^additional_config adaptspec\.featurizer: no saved featurizer"
    ):
        plugin_settings({"adaptspec": {"featurizer": str(tmp_path)}})


def test_a_long_value_is_shown_cut():
    with pytest.raises(AdaptspecError) as e:
        plugin_settings({"adaptspec": {"variants": {"A" * 10_000: "fixed:2"}}})
    assert len(str(e.value)) < 300


@pytest.mark.parametrize(
    "entry",
    [
        {},
        {"load_rule": "none"},
        {"load_rule": "goodput"},
        {"load_rule": "fixed:2"},
        {"load_rule": "table:1=3,4=1"},
        {"seed": 0, "decide_timeout": 1.0, "feedback_timeout": 10, "checkpoint_interval": 5},
    ],
)
def test_a_good_entry_is_read_as_written(entry):
    s = plugin_settings({"adaptspec": entry})
    assert {k: getattr(s, k) for k in entry} == entry


def test_the_split_gives_each_variant_its_weight():
    s = plugin_settings({"adaptspec": {"variants": TWO, "split": "30, 70"}})
    assert s.variant_weights() == {"A": 30.0, "B": 70.0}
    assert plugin_settings({"adaptspec": {"variants": TWO}}).variant_weights() == {"A": 1.0, "B": 1.0}
    assert plugin_settings({"adaptspec": {}}).variant_weights() is None


def test_an_additional_config_that_is_not_a_mapping_holds_no_entry():
    class Hashable:  # vLLM also takes an object with compute_hash() as additional_config
        def compute_hash(self) -> str:
            return "x"

    assert plugin_settings(Hashable()) == plugin_settings({})
