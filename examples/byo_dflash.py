"""Bring your own speculator: a DFlash-style loop of your own, adaptive from the first request,
then the whole toolchain (collect, train a head, serve an A/B test, report).

The speculator here is written in this file, not taken from adaptspec: a tiny Qwen3-shaped
target (transformers' ``Qwen3ForCausalLM`` from a config, small random weights) and a block
drafter that drafts a whole block in one pass, DFlash-style (mask positions attending to the
target's hidden states of the context). Its loop, :func:`dflash_generate`, is one function that
sizes its buffers from the block size before it prefills, as reference loops do; adaptspec's
:class:`~adaptspec.decoding.block_size_first.BlockSizeFirst` makes it a speculator without
splitting it. The weights are random, so drafts are mostly rejected: this shows the path, not
a speed-up.

What it shows, in order:

1. ``AdaptiveController(speculator)`` with no other argument: it decides (a cold policy over
   the block sizes the speculator can draft, since its features are not the bundled model's),
   decodes and learns from the first request;
2. the split form for an engine that decodes by itself, with no speculator object
   (``AdaptiveController.for_engine``): ``decide`` -> your decode -> ``feedback``;
3. ``collect_traces``: every block size on every prompt, a trace set;
4. ``adaptspec train-head`` on it;
5. ``adaptspec serve --speculator examples.byo_dflash:make`` with two variants, the head's
   policy and ``fixed:4``, on 127.0.0.1, requests sent with httpx;
6. ``adaptspec ab-report`` over the served decision log.

``make`` (max block size 8) and ``make16`` (16) are the factories the ``--speculator`` flag
takes. Run it from the repository root (about 30 s on 2 CPU cores; the serve extra is
needed)::

    python examples/byo_dflash.py
    python examples/byo_dflash.py --prompts 24 --requests 40 --out runs/byo
    adaptspec collect --speculator examples.byo_dflash:make --out runs/byo/traces --limit 20
"""

from __future__ import annotations

import argparse
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from torch import nn

from adaptspec import AdaptiveController, AdaptspecError, Outcome, Prefill, Round, prefill_features
from adaptspec.collect import collect_traces
from adaptspec.decoding.block_size_first import BlockSizeFirst

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 128  # the codec's ids: printable ASCII, tab and newline
EOS = 3
HIDDEN = 64
MAX_POSITIONS = 1024
TAPS = (1, 2)  # the target's hidden states the drafter reads (after decoder layers 1 and 2)


class ByteCodec:
    """Text <-> ids: printable ASCII, tab and newline as their code points (anything else: 0)."""

    def encode(self, text: str) -> list[int]:
        return [o if 32 <= (o := ord(ch)) < 127 or o in (9, 10) else 0 for ch in text]

    def decode(self, ids) -> str:
        return "".join(chr(i) for i in ids if 32 <= i < 127 or i in (9, 10))


def tiny_target(seed: int = 0) -> nn.Module:
    """A 2-layer Qwen3 over the codec's 128 ids, random weights (sharpened logits), eval mode."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        eos_token_id=EOS,
        bos_token_id=None,
        pad_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(cfg)
        with torch.no_grad():
            model.lm_head.weight.mul_(8.0)
    return model.eval()


class BlockDrafter(nn.Module):
    """Drafts ``block_size - 1`` tokens in one pass: the block (the last committed token, then mask
    positions) attends to itself, both ways, and to the target's tapped hidden states of the
    context; the target's own LM head turns the result into draft tokens."""

    def __init__(self, max_block_size: int, seed: int = 1) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.context = nn.Linear(len(TAPS) * HIDDEN, HIDDEN)
            self.mask = nn.Parameter(torch.randn(HIDDEN) * 0.02)
            self.position = nn.Embedding(max_block_size, HIDDEN)
            self.layer = nn.TransformerDecoderLayer(HIDDEN, 4, 2 * HIDDEN, dropout=0.0, batch_first=True)
            self.norm = nn.LayerNorm(HIDDEN)
        self.eval()

    @torch.inference_mode()
    def draft(self, target: nn.Module, context: torch.Tensor, last_token: int, block_size: int) -> list[int]:
        """``block_size - 1`` draft tokens after ``last_token``, given ``context`` ``[T, taps * H]``."""
        embed = target.get_input_embeddings()(torch.tensor([last_token]))  # [1, H]
        block = torch.cat([embed, self.mask.expand(block_size - 1, HIDDEN)])  # [B, H]
        block = block + self.position(torch.arange(block_size))
        h = self.layer(block[None], self.context(context)[None])  # no causal mask
        return target.lm_head(self.norm(h[0, 1:])).argmax(-1).tolist()


def pick(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> torch.Tensor:
    """The target's token at each row of ``logits``: argmax, or a sample at ``temperature``."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    return torch.multinomial(probs, 1, generator=gen)[:, 0]


def taps(hidden_states) -> torch.Tensor:
    return torch.cat([hidden_states[i][0] for i in TAPS], -1)


def check_prompt(prompt_ids: list[int]) -> None:
    if not prompt_ids or min(prompt_ids) < 0 or max(prompt_ids) >= VOCAB:
        raise AdaptspecError(f"a prompt needs 1 or more token ids in 0..{VOCAB - 1}")


@torch.inference_mode()
def dflash_generate(
    target: nn.Module,
    drafter: BlockDrafter,
    prompt_ids: list[int],
    block_size: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int | None = None,
) -> Outcome:
    """The whole loop at one block size: buffers sized from ``block_size``, prefill, then rounds of
    one drafter pass and one target pass; drafts are kept while they equal the target's own
    token (argmax, or at T > 0 its sample: every committed token is the target's)."""
    from transformers import DynamicCache

    check_prompt(prompt_ids)
    n = len(prompt_ids)
    out = torch.full((n + max_new_tokens + block_size,), EOS, dtype=torch.long)  # sized before the prefill
    out[:n] = torch.tensor(prompt_ids)
    gen = None if temperature <= 0 else torch.Generator().manual_seed(int(seed or 0))
    cache = DynamicCache(config=target.config)
    pre = target(input_ids=out[None, :n], cache=cache, use_cache=True, output_hidden_states=True)
    out[n] = pick(pre.logits[0, -1:], temperature, gen)[0]
    context, pos, rounds = taps(pre.hidden_states), n, []  # out[pos]: the last committed token
    t0 = time.perf_counter()
    while pos + 1 - n < max_new_tokens and int(out[pos]) != EOS:
        ta = time.perf_counter()
        drafts = drafter.draft(target, context, int(out[pos]), block_size) if block_size > 1 else []
        tb = time.perf_counter()
        block = torch.cat([out[pos : pos + 1], torch.tensor(drafts, dtype=torch.long)])
        v = target(input_ids=block[None], cache=cache, use_cache=True, output_hidden_states=True)
        want = pick(v.logits[0], temperature, gen)  # the target's tokens
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == int(want[accepted]):
            accepted += 1
        committed = drafts[:accepted] + [int(want[accepted])]
        committed = committed[: max_new_tokens - (pos + 1 - n)]
        if EOS in committed:
            committed = committed[: committed.index(EOS) + 1]
        out[pos + 1 : pos + 1 + len(committed)] = torch.tensor(committed)
        cache.crop(-(cache.get_seq_length() - (pos + accepted + 1)))  # drop the rejected drafts
        context = torch.cat([context, taps(v.hidden_states)[: accepted + 1]])
        pos += len(committed)
        rounds.append(Round(block_size, len(committed), tb - ta, time.perf_counter() - tb))
    tokens = out[n : pos + 1].tolist()
    return Outcome(
        tokens,
        rounds,
        decode_s=time.perf_counter() - t0,
        finish_reason="eos" if tokens[-1] == EOS else "length",
    )


class TinyDFlash(BlockSizeFirst):
    """The tiny target and drafter as a speculator: ``look`` is one target pass over the prompt,
    ``generate`` is :func:`dflash_generate`. It also carries what the adaptspec command needs:
    a ``codec``, its ``vocab_size`` and ``max_context``."""

    def __init__(self, max_block_size: int = 8, seed: int = 0) -> None:
        self.target = tiny_target(seed)
        self.drafter = BlockDrafter(max_block_size, seed + 1)
        super().__init__(self.look_at, self.run_loop, max_block_size, feature_dim=2 * HIDDEN + 1)
        self.codec = ByteCodec()
        self.vocab_size = VOCAB
        self.max_context = MAX_POSITIONS - max_block_size

    @torch.inference_mode()
    def look_at(self, prompt_ids: list[int], temperature: float = 0.0, seed: int | None = None) -> Prefill:
        """The first token and the standard features (``adaptspec.prefill_features``: the last layer's
        state at the last position, the middle layer's mean over the prompt, the log prompt length;
        129 values here, not the bundled model's 1153)."""
        check_prompt(prompt_ids)
        o = self.target(input_ids=torch.tensor([prompt_ids]), output_hidden_states=True)
        gen = None if temperature <= 0 else torch.Generator().manual_seed(int(seed or 0))
        return Prefill(int(pick(o.logits[0, -1:], temperature, gen)[0]), len(prompt_ids), prefill_features(o))

    def run_loop(self, prompt_ids, block_size, max_new_tokens, temperature=0.0, seed=None) -> Outcome:
        return dflash_generate(
            self.target, self.drafter, prompt_ids, block_size, max_new_tokens, temperature, seed
        )


def make() -> TinyDFlash:
    """``--speculator examples.byo_dflash:make``: max block size 8."""
    return TinyDFlash(max_block_size=8)


def make16() -> TinyDFlash:
    """``--speculator examples.byo_dflash:make16``: max block size 16."""
    return TinyDFlash(max_block_size=16)


# ------------------------------------------------------------------------------ the walk-through
PROMPTS = {
    "math": [
        "What is 17 times 23?",
        "Add 245 and 389, then halve it.",
        "Is 91 a prime number?",
        "Solve 3x + 7 = 22 for x.",
        "What is the square root of 144?",
        "Convert 5 km to metres.",
    ],
    "code": [
        "def fibonacci(n):",
        "Write a Python function that reverses a string.",
        "for i in range(10):",
        "SELECT name FROM users WHERE",
        "How do I read a file line by line in Python?",
        "class Stack:",
    ],
    "chat": [
        "Write a haiku about the sea.",
        "Summarise the plot of Hamlet.",
        "List three uses of copper.",
        "Say hello in French.",
        "What should I cook tonight?",
        "Tell me a short joke.",
    ],
}


def prompt_list(n: int) -> list[tuple[str, str]]:
    """``n`` (domain, prompt) pairs, the domains in turn."""
    turns = [(d, PROMPTS[d][i]) for i in range(6) for d in sorted(PROMPTS)]
    return [turns[i % len(turns)] for i in range(n)]


def adaptspec_cli(*args: str, timeout: float = 300) -> str:
    """Run ``adaptspec ARGS`` from the repository root (where ``examples.byo_dflash`` imports); its stdout."""
    p = subprocess.run(
        [sys.executable, "-m", "adaptspec", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    if p.returncode != 0:
        raise SystemExit(
            f"byo_dflash: adaptspec {args[0]} exited with {p.returncode}: {p.stderr.strip()[-2000:]}"
        )
    return p.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_ab(head: Path, log_dir: Path, requests: int, max_tokens: int, workdir: Path) -> Counter:
    """Serve the A/B test (A: the head's policy, B: fixed:4) and send ``requests`` requests."""
    import httpx

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "adaptspec",
        "serve",
        "--speculator",
        "examples.byo_dflash:make",
        "--threads",
        "1",
        "--variant",
        f"A=neural-linear:head={head}",
        "--variant",
        "B=fixed:4",
        "--log-dir",
        str(log_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    log = open(workdir / "server.txt", "w+")
    server = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    served: Counter = Counter()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60.0) as client:
            deadline = time.monotonic() + 120
            while True:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("byo_dflash: the server did not start")
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            for i, (_, prompt) in enumerate(prompt_list(requests)):
                r = client.post(
                    "/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "user": f"u{i}"}
                )
                r.raise_for_status()
                info = r.json()["adaptspec"]
                served[(info["variant"], info["block_size"])] += 1
    except BaseException:
        server.kill()
        log.seek(0)
        print(log.read()[-3000:], file=sys.stderr)
        raise
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)  # graceful: the log is rolled to Parquet
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
        server.wait()
        log.close()
    return served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=12, help="prompts to collect traces on (default 12)")
    parser.add_argument(
        "--requests", type=int, default=16, help="requests sent to the A/B server (default 16)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument(
        "--out", default=None, help="directory for traces, head and logs (default: a temporary one)"
    )
    args = parser.parse_args()
    if min(args.prompts, args.requests, args.max_new_tokens) < 1:
        parser.error("--prompts, --requests and --max-new-tokens must be >= 1")
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and the timings are steadier
    spec, codec = make(), ByteCodec()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        # 1. default construction: the policy is chosen from the speculator (its block sizes, its features)
        with AdaptiveController(spec, log_dir=out / "controller-log") as ctl:
            print(
                f"1. AdaptiveController(speculator): policy {ctl.policy_label}, block sizes {list(ctl.arms)}"
            )
            print(f"   why: {ctl.policy_choice}")
            for domain, prompt in prompt_list(3):
                g = ctl.generate(codec.encode(prompt), max_new_tokens=args.max_new_tokens)
                print(
                    f"   {domain:<5} B={g.decision.block_size} tau={g.outcome.mean_tau:.2f} "
                    f"tokens={g.outcome.new_tokens} reward={g.reward:.2f}"
                )
            print(f"   updates learnt: {ctl.sync().stats()['updates']}")
        # 2. the split form, for an engine that prefills and decodes by itself: no speculator object
        with AdaptiveController.for_engine(arms=[1, 2, 4, 8], feature_dim=spec.feature_dim) as engine:
            pre = spec.prefill(codec.encode("What is 6 times 7?"))  # the engine's own prefill
            decision = engine.decide(pre.features)
            outcome = spec.decode(pre, decision.block_size, args.max_new_tokens)  # the engine's own decode
            status = engine.feedback(decision.decision_id, outcome)
            print(
                f"2. for_engine: decide -> B={decision.block_size}, decode -> {outcome.new_tokens} tokens, "
                f"feedback -> {status}"
            )

        # 3. collect: every block size on every prompt (library call; `adaptspec collect --speculator` alike)
        triples = [(f"{d}-{i:03d}", d, codec.encode(p)) for i, (d, p) in enumerate(prompt_list(args.prompts))]
        traces = collect_traces(
            spec,
            triples,
            [1, 2, 4, 8],
            out / "traces",
            max_new_tokens=args.max_new_tokens,
            progress=False,
            overwrite=True,
        )
        print(
            f"3. collected {len(traces)} requests x block sizes {list(traces.arms)}; mean tau per block size "
            + ", ".join(f"{b}: {t:.2f}" for b, t in zip(traces.arms, traces.tau_matrix().mean(0)))
        )

        # 4. train a head on the trace set
        adaptspec_cli(
            "train-head", str(out / "traces"), "--out", str(out / "head"), "--pca", "8", "--overwrite"
        )
        print(f"4. trained a head on the trace set: {out / 'head'}")

        # 5. serve an A/B test with your speculator: the head's policy against fixed:4
        served = serve_ab(out / "head", out / "serve-log", args.requests, args.max_new_tokens, Path(tmp))
        for v in ("A", "B"):
            sizes = ", ".join(f"B={b}: {n}" for (name, b), n in sorted(served.items()) if name == v)
            print(
                f"5. variant {v}: {sum(n for (name, _), n in served.items() if name == v)} requests ({sizes})"
            )

        # 6. the A/B report over the served decision log
        report = adaptspec_cli("ab-report", str(out / "serve-log"))
        print("6. adaptspec ab-report:")
        print(report.rstrip())


if __name__ == "__main__":
    main()
