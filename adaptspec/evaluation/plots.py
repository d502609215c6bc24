"""The report's figures (matplotlib, PNG). Each function takes what a section returned and a path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .._util.atomic import save_figure
from ..reward.functions import REWARD_UNITS

#: contenders drawn in line plots (others would crowd them); the rest appear in the tables
MAIN = (
    "ucb-throughput",
    "head, classifier (BlockPilot-style)",
    "neural-linear (default)",
    "linucb (cold)",
    "squarecb (cold)",
)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(ax: Any, rows: list[dict], metric: str, title: str) -> None:
    rows = [r for r in rows if r["kind"] != "fixed"]
    names = [r["policy"] for r in rows][::-1]
    m = np.array([r[metric]["mean"] for r in rows])[::-1]
    lo = np.array([r[metric]["lo"] for r in rows])[::-1]
    hi = np.array([r[metric]["hi"] for r in rows])[::-1]
    colors = ["0.6" if n in ("oracle", "best fixed") else "C0" for n in names]
    ax.barh(np.arange(len(names)), m, xerr=np.vstack([m - lo, hi - m]), color=colors, capsize=3)
    ax.set_yticks(np.arange(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def plot_replay(data: dict, res: Any, path: Path) -> Path:
    """Cumulative regret over the stream and the gain over the best fixed block with 95% intervals."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [1.2, 1]})
    steps = res.steps
    for i, (label, cs) in enumerate(res.curves.items()):
        if label == "oracle":
            continue
        c = np.stack(cs)
        ls = "--" if label == "best fixed" else "-"
        a1.plot(steps, c.mean(axis=0), ls, color=f"C{i % 10}", label=label)
        if len(c) > 1:
            a1.fill_between(steps, c.min(axis=0), c.max(axis=0), color=f"C{i % 10}", alpha=0.12, lw=0)
    a1.set_xlabel("request in the stream")
    a1.set_ylabel(f"cumulative regret against the per-request oracle ({REWARD_UNITS[data['reward']]})")
    a1.set_title(
        f"{data['passes']} passes over {data['n_eval']} evaluation requests; mean of {data['runs']} runs "
        "(band: min..max)",
        fontsize=9,
    )
    a1.legend(fontsize=7, loc="upper left")
    a1.grid(alpha=0.3)
    _bars(a2, data["stream"], "gain_pct", "% gain over the best fixed block (in hindsight), 95% CI")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_hardware(plot: dict, path: Path) -> Path:
    """Mean reward per block size (relative to the best) per setting, and the value of adaptation."""
    plt = _plt()
    arms = plot["arms"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.8))
    settings = [("CPU (trace set's own timings)", plot["reference"])]
    settings += [(f"GPU profile, batch {b['batch_size']}", b["all_requests"]) for b in plot["batches"]]
    for i, (name, prof) in enumerate(settings):
        v = np.array([prof["mean_reward"][str(a)] for a in arms])
        a1.plot(arms, v / v.max(), "o-", color=f"C{i}", label=f"{name}: best fixed B={prof['best_fixed']}")
    a1.set_xlabel("block size B")
    a1.set_ylabel("mean throughput / that of the best fixed B")
    a1.set_xticks(arms)
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    a1.set_title("same acceptance, different costs: where the best fixed block lies", fontsize=9)
    labels = ["oracle", *[m for m in MAIN]]
    width = 0.8 / max(1, len(plot["batches"]))
    for i, b in enumerate(plot["batches"]):
        rows = {r["policy"]: r for r in b["stream"]}
        vals = [rows[lbl]["gain_pct"]["mean"] if lbl in rows else np.nan for lbl in labels]
        err = [
            (rows[lbl]["gain_pct"]["hi"] - rows[lbl]["gain_pct"]["mean"]) if lbl in rows else 0
            for lbl in labels
        ]
        a2.bar(
            np.arange(len(labels)) + i * width,
            vals,
            width,
            yerr=err,
            capsize=2,
            color=f"C{i + 1}",
            label=f"batch {b['batch_size']}",
        )
    a2.set_xticks(np.arange(len(labels)) + width * (len(plot["batches"]) - 1) / 2)
    a2.set_xticklabels(labels, rotation=20, ha="right", fontsize=7)
    a2.axhline(0, color="black", lw=0.8)
    a2.set_ylabel("% gain over the best fixed B (95% CI)")
    a2.set_title("value of adaptation on the GPU profile", fontsize=9)
    a2.legend(fontsize=8)
    a2.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_blockpilot(data: dict, path: Path) -> Path:
    """Mean tau per block size with the oracle and BlockPilot's own choices; policies' % of the oracle."""
    plt = _plt()
    fig, axes = plt.subplots(1, 1 + len(data["rewards"]), figsize=(14, 4.6))
    arms = data["arms"]
    tau = data["rewards"][0]["mean_tau"]
    a1 = axes[0]
    a1.plot(arms, [tau[str(a)] for a in arms], "o-", label="fixed B")
    rows = (
        {r["policy"]: r for r in data["rewards"][0]["policies"]}
        if data["rewards"][0]["reward"] == "tau"
        else {}
    )
    if "oracle" in rows:
        a1.axhline(
            rows["oracle"]["mean_tau"]["mean"], color="black", lw=3, alpha=0.4, label="per-prompt oracle"
        )
    sel = "BlockPilot's selector (released choices)"
    if sel in rows:
        a1.axhline(rows[sel]["mean_tau"]["mean"], color="C3", ls="--", label="BlockPilot's released choices")
    a1.set_xlabel("block size B")
    a1.set_ylabel("mean tau")
    a1.set_xticks(arms)
    a1.tick_params(axis="x", labelsize=7, labelrotation=90)
    a1.legend(fontsize=8)
    a1.grid(alpha=0.3)
    a1.set_title(
        f"{data['requests']} prompts ({', '.join(data['traces']['domains'])}): mean tau per B", fontsize=9
    )
    for ax, rw in zip(axes[1:], data["rewards"]):
        name = "tau" if rw["latency"] is None else f"throughput\nmodelled on {rw['latency']}"
        _bars(ax, rw["policies"], "pct_oracle", f"% of the per-prompt oracle, reward {name}")
        lo = min(r["pct_oracle"]["lo"] for r in rw["policies"] if r["kind"] != "fixed")
        ax.set_xlim(max(0.0, lo - 5), 101)
    fig.tight_layout()
    return save_figure(fig, path)


def plot_drift(plots: list[dict], path: Path) -> Path:
    """Windowed % of the oracle over a stream whose domain mix switches half way."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(plots), figsize=(7 * len(plots), 4.8), squeeze=False)
    show = (
        "best fixed of each phase (reference)",
        "ucb-throughput",
        "ucb-throughput (window 300)",
        "head, classifier (BlockPilot-style)",
        "neural-linear (default)",
        "linucb (cold)",
    )
    for ax, p in zip(axes[0], plots):
        for i, lbl in enumerate(show):
            if lbl in p["curves"]:
                ls = ":" if "reference" in lbl else "-"
                ax.plot(
                    p["steps"],
                    p["curves"][lbl],
                    ls,
                    color="black" if "reference" in lbl else f"C{i}",
                    label=lbl,
                )
        fixed = [k for k in p["curves"] if k.startswith("fixed:")]
        for k in fixed:
            ax.plot(p["steps"], p["curves"][k], "--", color="0.5", label=k)
        ax.axvline(p["change"], color="red", lw=1)
        ax.set_xlabel("request in the stream (the domain mix switches at the red line)")
        ax.set_ylabel(f"% of the per-request oracle, last {p['window']} requests")
        ax.set_title(p["label"], fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_coldstart(data: dict, path: Path) -> Path:
    """% of the oracle against the number of offline requests the head was trained on."""
    plt = _plt()
    hz = data["horizons"]
    fig, axes = plt.subplots(1, len(hz), figsize=(13, 4.6), squeeze=False)
    titles = {
        "first_pass": f"first pass ({data['n_eval']} requests, each once)",
        "stream": f"whole stream ({data['steps']} requests)",
    }
    for ax, key in zip(axes[0], ("first_pass", "stream")):
        h = hz[key]
        for i, (lbl, pts) in enumerate(h["warm"].items()):
            x = [p["size"] for p in pts]
            m = np.array([p["pct_oracle"]["mean"] for p in pts])
            ax.plot(x, m, "o-", color=f"C{i}", label=lbl)
            ax.fill_between(
                x,
                [p["pct_oracle"]["lo"] for p in pts],
                [p["pct_oracle"]["hi"] for p in pts],
                color=f"C{i}",
                alpha=0.15,
                lw=0,
            )
        for j, c in enumerate(h["cold"]):
            ax.axhline(
                c["pct_oracle"]["mean"],
                color=f"C{j + 3}",
                ls="--" if c["policy"] != "best fixed" else ":",
                label=c["policy"],
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(data["sizes"])
        ax.set_xticklabels([str(s) for s in data["sizes"]], rotation=45)
        ax.set_xlabel("requests the head was trained on (full information)")
        ax.set_ylabel("% of the per-request oracle (95% CI)")
        ax.set_title(titles[key], fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path)
