"""The peer benchmark (``python -m benchmarks.peers.seeds --quick``), run in process.

Checks what it reports against independent recomputations: our rows neither drop, repeat nor
overshoot; the padding fraction and real tokens of every configuration equal a plain recount;
the sweep picks, per peer and budget, the configuration with the most modelled tokens/s (one
that keeps to the budget first); every measured configuration was timed over the same blocks
as ours; one seed gives no verdict; the bootstrap interval of :func:`paired_ratio` matches the
delta method's closed form on synthetic steps, paired and unpaired; DeepSpeed's
``batch_by_seqlens`` computed here equals DeepSpeed's own.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import statistics

import numpy as np
import pytest

pytest.importorskip("torch")

from benchmarks.peers import model as pm
from benchmarks.peers import seeds as ps
from benchmarks.peers import sweep as sw
from benchmarks.peers import timing as pt

GROUPS = "fairseq,hf,lhotse"


@pytest.fixture(scope="module")
def quick() -> dict:
    argv = ["--quick", "--peers", GROUPS, "--no-result"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = ps.run(ps.parse_args(argv), argv)
    result["stdout"] = out.getvalue()
    if len(result["groups"]) < 2:  # the peers' packages are an optional benchmark extra
        pytest.skip(f"none of the peer groups {GROUPS} is installed")
    return result


def plain_recount(ranks: list[list[list[int]]], tl: np.ndarray) -> tuple[float, int]:
    """(padding fraction of both padded tensors, real target tokens), by plain loops."""
    slots = real = tgt = 0
    for rank in ranks:
        for batch in rank:
            src, dst = [int(tl[i, 0]) for i in batch], [int(tl[i, 1]) for i in batch]
            slots += len(batch) * (max(src) + max(dst))
            real += sum(src) + sum(dst)
            tgt += sum(d - 1 for d in dst)  # [BOS] + target predicts the target's tokens
    return 1 - real / slots, tgt


@pytest.mark.slow
def test_ours_recount(quick: dict) -> None:
    ours = [r for r in quick["rounds"] if r["row"] == "ours"]
    assert ours
    for r in ours:
        assert (r["dropped"], r["repeated"], r["over"]) == (0, 0, 0), r
        assert r["equal_counts"] and not r["hangs"] and r["dummy"] == 0


@pytest.mark.slow
def test_padding_and_tokens_match_a_plain_recount(quick: dict) -> None:
    seed, m = 0, 512
    _, tl = pm.workload(2000, seed)
    for r in quick["rounds"]:
        ranks = [pm.deal_row(r["row"], tl, r["setting"], k, 2, seed) for k in range(2)]
        pad, tokens = plain_recount(ranks, tl)
        assert r["pad_fraction"] == pytest.approx(pad, abs=1e-12), r["row"]
        assert r["tokens"] == tokens, r["row"]
        ids = np.concatenate([np.asarray(b) for rank in ranks for b in rank])
        assert r["dropped"] == 2000 - np.unique(ids).size
        assert r["repeated"] == ids.size - np.unique(ids).size
        sides = [len(b) * max(tl[b].max(axis=0)) for rank in ranks for b in rank]
        assert r["over"] == sum(s > m for s in sides)


@pytest.mark.slow
def test_sweep_picks_the_best_per_budget(quick: dict) -> None:
    for m, picked in quick["choice"].items():
        for group, pick in picked.items():
            configs = quick["groups"][group]
            # the peer's default first; fairseq's algorithm stands in without its package
            assert pick["default"] == configs[0]
            assert configs[0] in (sw.GROUPS[group][0], "fairseq_alg")
            assert set(configs) <= {*sw.GROUPS[group], "fairseq_alg"}
            here = {c: [r for r in quick["rounds"] if r["row"] == c and r["budget"] == m]
                    for c in configs}  # fmt: skip
            fair = [c for c in configs if max(r["over"] for r in here[c]) == 0] or configs
            best = max(statistics.median(r["tps_model"] for r in here[c]) for c in fair)
            chosen = statistics.median(r["tps_model"] for r in here[pick["best"]])
            assert pick["best"] in fair and chosen == best, (group, m)
    if "fairseq" in quick["groups"] and quick["groups"]["fairseq"] != ["fairseq_alg"]:
        assert len(quick["groups"]["fairseq"]) == 4  # multiple 1 / 8 x grouped_shuffling


@pytest.mark.slow
def test_every_configuration_measured_over_the_same_blocks(quick: dict) -> None:
    ours = quick["measured"]["512/budget/ours"]
    for key, entries in quick["measured"].items():
        for mine, theirs in zip(ours, entries, strict=True):
            assert mine["seed"] == theirs["seed"]
            assert len(theirs["wall"]) == len(theirs["cpu"]) == len(mine["wall"]) == 3, key
            assert all(x > 0 for x in theirs["wall"] + theirs["cpu"]) and theirs["tokens"] > 0
            assert all(0 <= j < theirs["steps"] for j in theirs["positions"])


@pytest.mark.slow
def test_one_seed_gives_no_verdict(quick: dict) -> None:
    assert quick["verdicts"]
    for v in quick["verdicts"].values():
        assert v["wall"]["verdict"] == v["cpu"]["verdict"] == "no verdict (1 seed)"
        assert v["wall"]["lo"] <= v["wall"]["ratio"] <= v["wall"]["hi"]
    text = quick["stdout"]
    assert "beyond spread" not in text and "leads" not in text and " tie" not in text


def test_verdict_rules() -> None:
    base = {"ratio": 1.0, "seeds": 2}
    assert pt.verdict({**base, "lo": 1.01, "hi": 1.2}) == "ours leads"
    assert pt.verdict({**base, "lo": 0.8, "hi": 0.99}) == "peer leads"
    assert pt.verdict({**base, "lo": 0.99, "hi": 1.2}) == "tie"
    assert pt.verdict({**base, "lo": 1.1, "hi": 1.2, "seeds": 1}) == "no verdict (1 seed)"


@pytest.mark.parametrize("shared", [0.0, 0.08])
def test_bootstrap_interval_matches_the_closed_form(shared: float) -> None:
    """One seed, K paired steps: the log ratio's delta-method sd is
    ``sd(x_p / mu_p - x_o / mu_o) / sqrt(K)``; the 90 % interval ``r exp(+-1.645 sd)``.
    ``shared``: a load factor common to both sides of a block (pairing must cancel it)."""
    rng = np.random.default_rng(7)
    k = 400
    load = 1 + shared * rng.standard_normal(k)
    t_o = (1.0 + 0.1 * rng.standard_normal(k)) * load
    t_p = (1.2 + 0.1 * rng.standard_normal(k)) * load
    ours, peer = pt.Sample(100, 5000, list(t_o), list(t_o)), pt.Sample(100, 5000, list(t_p), [])
    r = pt.paired_ratio([ours], [peer], "wall", n_boot=4000, seed=1)
    ratio = t_p.mean() / t_o.mean()
    assert r["ratio"] == pytest.approx(ratio)
    sd = np.std(t_p / t_p.mean() - t_o / t_o.mean(), ddof=1) / np.sqrt(k)
    lo, hi = ratio * np.exp(-1.645 * sd), ratio * np.exp(1.645 * sd)
    half = (hi - lo) / 2
    assert abs(r["lo"] - lo) < 0.15 * half and abs(r["hi"] - hi) < 0.15 * half, (r, lo, hi)


def test_bootstrap_over_seeds_widens_with_their_spread() -> None:
    """Seeds whose ratios differ give a wider interval than seeds that agree."""
    rng = np.random.default_rng(3)

    def seed_pair(scale: float) -> tuple[pt.Sample, pt.Sample]:
        t = 1 + 0.05 * rng.standard_normal(50)
        return pt.Sample(10, 100, list(t), []), pt.Sample(10, 100, list(t * scale), [])

    agree = [seed_pair(1.1) for _ in range(4)]
    differ = [seed_pair(s) for s in (1.0, 1.05, 1.15, 1.2)]
    a = pt.paired_ratio([x for x, _ in agree], [y for _, y in agree], "wall")
    d = pt.paired_ratio([x for x, _ in differ], [y for _, y in differ], "wall")
    assert d["hi"] - d["lo"] > 5 * (a["hi"] - a["lo"])
    assert a["lo"] <= 1.1 <= a["hi"]


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="no deepspeed")
def test_batch_by_seqlens_equals_deepspeeds_own() -> None:
    sw.check_deepspeed(300, 384)


def test_pick_best_prefers_configurations_within_the_budget() -> None:
    scores = {"a": [1.0, 1.1], "b": [2.0, 2.0], "c": [1.5, 1.6]}
    assert sw.pick_best(scores, {"a": 0, "b": 3, "c": 0}) == "c"
    assert sw.pick_best(scores, {"a": 1, "b": 3, "c": 2}) == "b"


def test_fit_is_non_negative_and_exact_on_a_model() -> None:
    n, s, t = [1, 2, 4, 8, 3, 5, 7, 9, 2], [9, 5, 3, 2, 7, 4, 6, 1, 8], [8, 6, 2, 3, 9, 5, 4, 2, 7]
    x = pm.padded_features(n, s, t, [5, 9, 11, 15, 20, 18, 25, 7, 12])
    truth = np.array([2.0, 0.5, 0.1, 0.3, 0.0, 0.01, 0.0, 0.2, 0.003, 0.0])
    coef, err = pm.fit(x, x @ truth)
    assert (coef >= 0).all() and np.abs(err).max() < 1e-9


def test_largest_finds_the_largest_fitting_setting() -> None:
    for limit in (1, 7, 64, 99, 100):
        assert pm.largest(lambda s, lim=limit: s <= lim, 50, 1, 100, 1) == limit
    assert pm.largest(lambda s: s <= 517, 300, 1, 2000, 8) in range(510, 518)
    with pytest.raises(RuntimeError):
        pm.largest(lambda s: False, 5, 1, 10, 1)
