"""Wrap a speculative decoder with AdaptiveController and let it pick each request's block size.

What it shows:

1. ``ctl.generate(prompt_ids)``: the controller runs the prefill, chooses the block size from
   the prefill's features with its policy (the default: neural-linear over the bundled head),
   decodes, computes the reward (minus milliseconds per token) and learns from it. Every
   decision is written to a decision log and the policy is checkpointed.
2. ``ctl.decide(features)`` / ``ctl.feedback(decision_id, outcome)``: the same loop for an
   engine that runs prefill and decoding itself.

The prompts are public benchmark prompts (GSM8K, MT-Bench, HumanEval) shipped with adaptspec.
Run it (about 20 s on 2 CPU cores with the defaults; the first run converts the bundled model
into ~/.cache/adaptspec)::

    python examples/wrap_speculator.py
    python examples/wrap_speculator.py --prompts 3 --max-new-tokens 64 --out runs/example
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from adaptspec import AdaptiveController
from adaptspec.models import load_speculator
from adaptspec.models.prompts import benchmark_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--prompts",
        type=int,
        default=3,
        help="how many benchmark prompts (GSM8K, MT-Bench, HumanEval in turn)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--out",
        default=None,
        help="directory for the decision log and checkpoints (default: a temporary one)",
    )
    args = parser.parse_args()
    if args.prompts < 1 or args.max_new_tokens < 1:
        parser.error("--prompts and --max-new-tokens must be >= 1")

    # The bundled speculator: SmolLM2-135M-Instruct as the target and the block-diffusion
    # drafter trained for it, bfloat16 on the CPU ("fast" verification: the model's own kernels).
    speculator = load_speculator()
    # The first calls of each kernel shape are slow; pay for them before anything is timed.
    warm = speculator.prefill(speculator.target.encode_chat("Warm-up."))
    for b in (1, speculator.max_block_size):
        speculator.decode(warm, b, 8)
    # One prompt per benchmark, then a second round of each, and so on.
    per = -(-args.prompts // 3)
    prompts = benchmark_prompts(per_benchmark=per)[: args.prompts]

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        # policy=None: the product default. log_dir gets one row per decision (block size,
        # propensity, reward, features); checkpoint_dir gets the learnt state, and a new
        # controller over the same directories resumes from it.
        with AdaptiveController(speculator, log_dir=out / "log", checkpoint_dir=out / "ckpt") as ctl:
            print(f"policy {ctl.policy_label}, block sizes {list(ctl.arms)}")
            print(f"{'benchmark':<20} {'B':>3} {'tau':>5} {'tok/s':>6} {'reward':>8}")

            # --- 1. the controller drives the whole request --------------------------------
            for p in prompts:
                ids = speculator.target.encode_chat(p.prompt)  # chat template -> token ids
                g = ctl.generate(ids, max_new_tokens=args.max_new_tokens)
                o = g.outcome
                # reward = minus milliseconds per new token (bigger is better); None when it is
                # undefined (no decode time measured), and then nothing is learnt
                speed = f"{o.new_tokens / o.decode_s:.1f}" if o.decode_s > 0 else "-"
                reward = "-" if g.reward is None else f"{g.reward:.2f}"
                print(f"{p.domain:<20} {g.decision.block_size:>3} {o.mean_tau:>5.2f} {speed:>6} {reward:>8}")

            # --- 2. an engine that decodes itself ------------------------------------------
            ids = speculator.target.encode_chat(prompts[0].prompt)
            pre = speculator.prefill(ids)  # the engine's own prefill
            decision = ctl.decide(pre.features)  # block size for this request
            outcome = speculator.decode(pre, decision.block_size, args.max_new_tokens)
            status = ctl.feedback(decision.decision_id, outcome)  # logged durably, update queued
            print(
                f"engine-style: decide -> B={decision.block_size} (propensity {decision.propensity:.2f}), "
                f"feedback -> {status}"
            )

            ctl.sync()  # wait for queued updates
            text = speculator.target.tokenizer.decode(outcome.tokens, skip_special_tokens=True)
            print(f"updates learnt: {ctl.stats()['updates']}; the engine-style answer starts {text[:60]!r}")
        # Leaving the block closed the controller: final checkpoint, log rolled to Parquet.
        if args.out:
            print(f"decision log: {out / 'log'}, checkpoints: {out / 'ckpt'}")


if __name__ == "__main__":
    main()
