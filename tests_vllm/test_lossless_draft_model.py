"""Lossless with vLLM's ``draft_model``: the tokens of vLLM without speculation for every request of a
concurrent mix (the check is in _lossless.py)."""

from _lossless import reference, same_tokens_as_vllm_without_speculation  # noqa: F401 - reference: the fixture


def test_same_tokens_as_vllm_without_speculation(models, reference, tmp_path):  # noqa: F811
    same_tokens_as_vllm_without_speculation(models, reference, "draft_model", tmp_path)
