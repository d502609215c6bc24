"""Simulators: trace replay, synthetic scenarios with a known optimum, off-policy evaluation."""

from .ope import ESTIMATORS, Estimate, dm, dr, evaluate, evaluate_log, fit_reward_model, ips, policy_probs, snips, switch_dr
from .replay import ReplayReport, replay, replay_log, stream_order
from .synthetic import SCENARIOS, generate

__all__ = [
    "ESTIMATORS",
    "Estimate",
    "ReplayReport",
    "SCENARIOS",
    "dm",
    "dr",
    "evaluate",
    "evaluate_log",
    "fit_reward_model",
    "generate",
    "ips",
    "policy_probs",
    "replay",
    "replay_log",
    "snips",
    "stream_order",
    "switch_dr",
]
