"""Issue 12 in the planner: an even tail, loud oversize policies, and errors that say what to fix.

Every test here failed before the fix it guards.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from lightning_varbatch import EpochPlanner, PlanConfig, TokenBudgetBatchSampler, plan_epoch
from lightning_varbatch.errors import SettingError, SettingTypeError
from lightning_varbatch.plan import main
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.mixture_datasets import DataSource, mixture_probabilities

# -- §5: the tail is as even as the rest ----------------------------------------------------


def test_tail_of_13_equal_examples_is_cut_4_3_3_3() -> None:
    # 13 examples of length 10, 4 fit the budget: the greedy cut is [4, 4, 4, 1]; the one
    # optimizer step of 2 ranks x 2 micro-batches must get [4, 3, 3, 3] (7 vs 6 per rank).
    planner = EpochPlanner(np.full(13, 10), PlanConfig(max_tokens=40))
    plan = planner.plan(0, world_size=2, accumulate_grad_batches=2)
    assert plan.num_steps == 1
    assert sorted(plan.micro_batch_size[plan.assign[0]].ravel().tolist()) == [3, 3, 3, 4]
    assert sorted(plan.micro_batch_size[plan.assign[0]].sum(axis=1).tolist()) == [6, 7]
    samplers = [
        TokenBudgetBatchSampler(
            np.full(13, 10), 40, rank=r, world_size=2, accumulate_grad_batches=2
        )
        for r in range(2)
    ]
    per_rank = [[len(b) for b in s] for s in samplers]
    assert sorted(size for sizes in per_rank for size in sizes) == [3, 3, 3, 4]
    assert sorted(sum(p) for p in per_rank) == [6, 7]


def test_tail_after_full_steps_is_even_too() -> None:
    plan = plan_epoch(np.full(29, 10), 40, world_size=2, accumulate_grad_batches=2)
    sizes = sorted(sorted(plan.micro_batch_size[s].ravel().tolist()) for s in plan.assign)
    assert sizes == [[3, 3, 3, 4], [4, 4, 4, 4]]


# -- §3: oversize="truncate"/"skip" never silent, never nearly everything -----------------


def test_truncating_most_examples_is_refused_with_counts() -> None:
    lengths = np.array([4] + [40] * 10)  # 10 of 11 over a budget of 8
    with pytest.raises(ValueError) as err:
        EpochPlanner(lengths, PlanConfig(max_tokens=8, oversize="truncate"))
    message = str(err.value)
    for piece in ("oversize='truncate'", "10 of 11", "max_tokens=8", "50%", "raise max_tokens"):
        assert piece in message


def test_skipping_most_examples_is_refused() -> None:
    with pytest.raises(ValueError, match="oversize='skip' would leave 3 of 4 examples left out"):
        EpochPlanner(np.array([4, 40, 50, 60]), PlanConfig(max_tokens=8, oversize="skip"))


def test_truncation_warns_with_counts_and_exposes_them() -> None:
    lengths = np.array([4, 5, 6, 40])
    with pytest.warns(UserWarning, match=r"1 of 4 examples .* cut to length 20 "):
        planner = EpochPlanner(lengths, PlanConfig(max_tokens=20, oversize="truncate"))
    assert (planner.num_truncated, planner.num_skipped, planner.truncate_to) == (1, 0, 20)
    assert planner.plan(0).num_truncated == 1
    with pytest.warns(UserWarning, match="num_skipped=1"):
        skipping = EpochPlanner(lengths, PlanConfig(max_tokens=20, oversize="skip"))
    assert (skipping.num_skipped, skipping.num_truncated) == (1, 0)


def test_exactly_the_allowed_fraction_is_accepted() -> None:
    from lightning_varbatch.planner.lengths import MAX_OVERSIZE_FRACTION

    assert MAX_OVERSIZE_FRACTION == 0.5
    with pytest.warns(UserWarning):
        planner = EpochPlanner(np.array([4, 4, 40, 40]), PlanConfig(8, oversize="truncate"))
    assert planner.num_truncated == 2


def test_mixture_counts_and_names_the_dataset() -> None:
    ok = DataSource(np.full(8, 4), name="ok")
    cut = DataSource(np.array([4, 4, 4, 40]), name="cut")
    with pytest.warns(UserWarning):
        planner = MixturePlanner([ok, cut], PlanConfig(max_tokens=16, oversize="truncate"))
    assert (planner.num_truncated, planner.num_skipped) == (1, 0)
    many = DataSource(np.full(4, 40), name="long")
    with pytest.raises(ValueError, match=r"Dataset 'long' \(index 1\): oversize='truncate'"):
        MixturePlanner([ok, many], PlanConfig(max_tokens=16, oversize="truncate"))


# -- §3: per-dataset settings are checked like the global ones ------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_examples": 0}, "max_examples must be a positive integer, got 0"),
        ({"max_examples": 2.5}, r"max_examples must be a positive integer, got 2.5"),
        ({"max_tokens": 0}, "max_tokens must be a positive integer, got 0"),
        ({"max_tokens": "64"}, "max_tokens must be a positive integer, got '64'"),
        ({"name": ""}, "name must be a non-empty string or None, got ''"),
        ({"name": 3}, "name must be a non-empty string or None, got 3"),
    ],
)
def test_bad_data_source_settings(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DataSource(np.full(8, 4), **kwargs)  # type: ignore[arg-type]


def test_per_dataset_settings_are_honoured_and_errors_name_the_dataset() -> None:
    config = PlanConfig(max_tokens=64)
    capped = DataSource(np.full(8, 4), name="capped", max_examples=np.int64(2))
    planner = MixturePlanner([np.full(8, 4), capped], config)
    assert planner.planners[1].config.max_examples == 2
    assert planner.plan(0).micro_batch_size[planner.plan(0).micro_batch_dataset == 1].max() == 2
    bad = DataSource(np.full(8, 4), name="b", loss_lengths=np.ones(3))
    with pytest.raises(ValueError, match=r"Dataset 'b' \(index 1\): loss_lengths has shape"):
        MixturePlanner([np.full(8, 4), bad], config)
    with pytest.raises(ValueError, match=r"Dataset '1' \(index 1\): lengths\[2\] = -1"):
        MixturePlanner([np.full(8, 4), np.array([3, 3, -1])], config)
    with pytest.raises(TypeError, match=r"sources must be a list of datasets .*got ndarray"):
        MixturePlanner(np.full((3, 2), 4), config)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"weights": [1, "a"], "steps_per_epoch": 4}, r"weights\[1\] is 'a' \(str\)"),
        ({"weights": 5, "steps_per_epoch": 4}, "weights must be 'size' or a sequence of 2"),
        ({"weights": [1, 2, 3], "steps_per_epoch": 4}, "weights has 3 entries"),
        ({"temperature": "2"}, r"temperature must be a real number, got '2' \(str\)"),
        ({"temperature": 0.0}, "temperature must be a finite number > 0, got 0.0"),
        ({"steps_per_epoch": 0}, "steps_per_epoch must be a positive integer, got 0"),
        ({"steps_per_epoch": 2.0}, r"steps_per_epoch must be a positive integer, got 2.0"),
        ({"mixing": None}, "mixing must be one of 'per_step', 'per_batch', got None"),
    ],
)
def test_bad_mixture_settings(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        MixturePlanner([np.full(8, 4), np.full(8, 4)], PlanConfig(16), **kwargs)  # type: ignore[arg-type]


def test_numpy_temperature_is_a_number() -> None:
    probs = mixture_probabilities(np.array([3, 1]), "size", np.float32(2.0))  # type: ignore[arg-type]
    assert probs.shape == (2,)


# -- §4: numpy integers, bools, huge lengths, ragged lengths ------------------------------


def test_numpy_integers_are_accepted_everywhere() -> None:
    config = PlanConfig(
        max_tokens=np.int64(1024),  # type: ignore[arg-type]
        max_examples=np.int32(8),  # type: ignore[arg-type]
        batch_size_multiple=np.int64(2),  # type: ignore[arg-type]
        pad_to_multiple_of=np.int64(8),  # type: ignore[arg-type]
        bucket_width=np.int16(2),  # type: ignore[arg-type]
        seed=np.uint8(3),  # type: ignore[arg-type]
    )
    assert type(config.max_tokens) is int and config.max_tokens == 1024
    assert (
        config.fingerprint()
        == PlanConfig(
            1024, 8, batch_size_multiple=2, pad_to_multiple_of=8, bucket_width=2, seed=3
        ).fingerprint()
    )
    plan = EpochPlanner(np.full(20, 5), config).plan(np.int64(1), np.int64(2), np.int32(1))
    assert sorted(plan.example_ids().tolist()) == list(range(20))


@pytest.mark.parametrize("value", ["false", "False", 0, 1, None, 1.0])
def test_non_bool_shuffle_is_refused(value: object) -> None:
    with pytest.raises(TypeError, match=f"shuffle must be True or False, got {value!r}"):
        PlanConfig(16, shuffle=value)  # type: ignore[arg-type]


def test_numpy_bool_shuffle_is_a_bool() -> None:
    assert PlanConfig(16, shuffle=np.bool_(False)).shuffle is False


@pytest.mark.parametrize(
    ("setting", "value", "match"),
    [
        ("max_tokens", 10.0, r"max_tokens must be a positive integer, got 10.0 \(float\)"),
        ("max_tokens", True, r"max_tokens must be a positive integer, got True \(bool\)"),
        ("max_examples", True, r"max_examples must be a positive integer, got True \(bool\)"),
        ("seed", 1.0, r"seed must be a non-negative integer, got 1.0 \(float\)"),
        ("seed", "3", r"seed must be a non-negative integer, got '3' \(str\)"),
        ("quadratic_coef", "0.5", r"quadratic_coef must be a real number, got '0.5' \(str\)"),
        ("quadratic_coef", float("inf"), "quadratic_coef must be a finite number >= 0, got inf"),
        ("tail", None, r"tail must be one of 'spread', 'drop', 'pad'.*got None \(NoneType\)"),
    ],
)
def test_wrongly_typed_settings_name_the_setting(setting: str, value: object, match: str) -> None:
    kwargs: dict[str, object] = {"max_tokens": 64, setting: value}
    with pytest.raises(ValueError, match=match) as e:
        PlanConfig(**kwargs)  # type: ignore[arg-type]
    assert isinstance(e.value, SettingError) and e.value.setting == setting


def test_batch_size_multiple_above_max_examples_warns() -> None:
    with pytest.warns(UserWarning, match="batch_size_multiple=8 is larger than max_examples=3"):
        PlanConfig(64, max_examples=3, batch_size_multiple=8)


@pytest.mark.parametrize("world", [2.0, "2", True])
def test_float_world_size_is_refused(world: object) -> None:
    with pytest.raises(ValueError, match=f"world_size must be a positive integer, got {world!r}"):
        EpochPlanner(np.full(8, 4), PlanConfig(16)).plan(0, world)  # type: ignore[arg-type]


def test_planner_needs_a_plan_config() -> None:
    with pytest.raises(TypeError, match="config must be a PlanConfig, got dict"):
        EpochPlanner(np.full(8, 4), {"max_tokens": 16})  # type: ignore[arg-type]


def test_exclude_must_be_a_boolean_mask() -> None:
    planner = EpochPlanner(np.full(4, 4), PlanConfig(16))
    with pytest.raises(TypeError, match="exclude must be a boolean mask over the 4 examples"):
        planner.plan(0, exclude=np.array([0, 1, 0, 1]))


@pytest.mark.parametrize(
    ("lengths", "budget"),
    [
        (np.array([3, 2**22 + 5, 5]), 2**23),
        (np.array([[2**23, 4], [3, 3]]), 2**24),
        (np.array([3, 2**30, 5]), 2**31 - 1),
    ],
)
def test_lengths_far_above_2_22_within_the_budget_are_planned(
    lengths: np.ndarray, budget: int
) -> None:
    plan = plan_epoch(lengths, budget)
    assert sorted(plan.example_ids().tolist()) == list(range(len(lengths)))
    assert (plan.micro_batch_cost <= budget).all()


def test_truncation_to_a_length_above_2_22() -> None:
    with pytest.warns(UserWarning):
        planner = EpochPlanner(np.array([3, 2**25, 5]), PlanConfig(2**23, oversize="truncate"))
    assert planner.truncate_to == 2**23


@pytest.mark.parametrize(
    ("lengths", "error", "pieces"),
    [
        ([[3, 4], [5]], ValueError, ("lengths", "ragged", "lengths[1] is [5]")),
        (np.ones((4, 3), dtype=int), ValueError, ("lengths", "(4, 3)", "two columns")),
        (np.array(["3", "5"]), TypeError, ("lengths", "<U1", "lengths[0] is ['3']")),
        ("3 5 2", TypeError, ("lengths", "str", "'3 5 2'")),
        ([3, None, 4], TypeError, ("lengths", "object", "lengths[1] is [None]")),
        (None, TypeError, ("lengths", "None")),
        ({"a": 3}, TypeError, ("lengths", "dict")),
        (np.array(5), ValueError, ("lengths", "shape ()", "one length per example")),
        (np.array([3.0, np.nan]), ValueError, ("lengths[1] is nan",)),
        (np.array([3.0, 2.5]), ValueError, ("lengths[1] = 2.5",)),
        (np.array([3, -2]), ValueError, ("lengths[1] = -2", ">= 1")),
        (np.array([], dtype=int), ValueError, ("lengths is empty",)),
        (np.array([3, 2**31]), ValueError, ("lengths[1] = 2147483648", "< 2**31")),
    ],
)
def test_bad_lengths_name_the_item_the_value_and_the_rule(
    lengths: object, error: type[Exception], pieces: tuple[str, ...]
) -> None:
    with pytest.raises(error) as err:
        plan_epoch(lengths, 64)  # type: ignore[arg-type]
    for piece in pieces:
        assert piece in str(err.value)


def test_bad_loss_lengths_are_named() -> None:
    with pytest.raises(ValueError, match=r"loss_lengths\[1\] = -1: every length must be >= 0"):
        plan_epoch(np.array([3, 4]), 64, loss_lengths=np.array([2, -1]))
    # 0 is a valid loss length: a one-token document has no next token to predict.
    assert int(plan_epoch(np.array([1, 4]), 64, loss_lengths=np.array([0, 3])).step_tokens[0]) == 3


@pytest.mark.parametrize(
    ("cost", "match"),
    [
        (lambda n, longest, total: np.array([1.0]), r"cost= returned \[1.0\] \(shape \(1,\)\)"),
        (lambda n, longest, total: np.full(np.shape(n), np.nan), "one finite cost >= 0"),
        (lambda n, longest, total: n.tolist() + "x", "cost= raised TypeError"),
    ],
)
def test_broken_cost_models_are_refused_at_construction(cost: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PlanConfig(64, cost=cost)  # type: ignore[arg-type]


# -- §4: the plan CLI writes what it prints, and names bad files ---------------------------


@pytest.fixture
def lengths_file(tmp_path: Path) -> Path:
    path = tmp_path / "lengths.npy"
    np.save(path, np.array([3, 5, 2, 7, 4, 6] * 5))
    return path


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_png_without_suffix_gets_png_and_is_printed(
    lengths_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "report"
    code, out, _ = _cli(
        ["--lengths", str(lengths_file), "--max-tokens", "20", "--png", str(target)], capsys
    )
    assert code == 0
    assert (tmp_path / "report.png").is_file() and not target.exists()
    assert f"wrote {tmp_path / 'report.png'}" in out


@pytest.mark.parametrize(
    ("png", "match"),
    [
        (".", "is a directory; pass a file name"),
        ("report.pdf", "must name a .png file, got suffix '.pdf'"),
        ("missing_dir/report.png", "the folder"),
    ],
)
def test_bad_png_paths_are_refused_before_planning(
    png: str,
    match: str,
    lengths_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = _cli(
        ["--lengths", str(lengths_file), "--max-tokens", "20", "--png", png], capsys
    )
    assert code == 2 and match in err and "--png" in err
    assert out == ""  # refused before any planning


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda d: d / "missing.npy", "no such file"),
        (lambda d: d, "it is a directory"),
        (lambda d: _write(d / "bad.npy", np.ones((4, 3), dtype=int)), "got shape (4, 3)"),
        (lambda d: _write(d / "neg.npy", np.array([3, -1])), "lengths[1] = -1"),
        (lambda d: _text(d / "junk.npy"), "as a .npy array"),
    ],
)
def test_bad_lengths_files_are_named(
    make: object, match: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    code, _, err = _cli(["--lengths", str(path), "--max-tokens", "20", "--no-png"], capsys)
    assert code == 2
    assert f"--lengths {str(path)!r}" in err and match in err


def _write(path: Path, array: np.ndarray) -> Path:
    np.save(path, array)
    return path


def _text(path: Path) -> Path:
    path.write_text("hello")
    return path


def test_cli_prints_the_truncation_warning(
    lengths_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["--lengths", str(lengths_file), "--max-tokens", "5", "--oversize", "truncate", "--no-png"]
    )
    _, err = capsys.readouterr()
    assert code == 0
    assert "warning: oversize='truncate': 10 of 30 examples" in err


# -- §5 siblings: mismatched objects and indices give errors, not IndexError/silence -------


def test_plan_of_another_planner_is_refused() -> None:
    from lightning_varbatch.planner.diagnostics import diagnose
    from lightning_varbatch.planner.mixture_report import dataset_breakdown

    small = EpochPlanner(np.full(20, 4), PlanConfig(16))
    other = EpochPlanner(np.full(50, 4), PlanConfig(16)).plan(0, 2)
    with pytest.raises(ValueError, match="plan holds example id 49 but the planner has only 20"):
        diagnose(small, other)
    mixture = MixturePlanner([np.full(8, 4), np.full(8, 4)], PlanConfig(16))
    with pytest.raises(ValueError, match="plan is not a plan of this mixture of 2 datasets"):
        dataset_breakdown(mixture, small.plan(0))
    with pytest.raises(ValueError, match=r"dataset must be a dataset index in \[0, 2\)"):
        mixture.budget(5)


@pytest.mark.parametrize(
    ("history", "match"),
    [
        ([(2, 1)], r"history\[0\] is \(2, 1\): each entry must be a \(world_size"),
        ([(2, 1.0, 0)], r"history\[0\] accumulate_grad_batches must be a positive integer"),
        ("21", "history must be a sequence of"),
    ],
)
def test_malformed_resume_history_is_named(history: object, match: str) -> None:
    planner = EpochPlanner(np.full(20, 4), PlanConfig(16))
    with pytest.raises(ValueError, match=match):
        planner.plan_resumed(0, 2, 1, history)  # type: ignore[arg-type]
    mixture = MixturePlanner([np.full(8, 4), np.full(8, 4)], PlanConfig(16))
    with pytest.raises(ValueError, match=match):
        mixture.plan_resumed(0, 2, 1, history)  # type: ignore[arg-type]


def test_float_rank_and_counts_are_refused() -> None:
    from lightning_varbatch.planner.synthetic import wmt_like_lengths

    plan = EpochPlanner(np.full(20, 4), PlanConfig(16)).plan(0, 2)
    with pytest.raises(ValueError, match=r"rank must be an integer in \[0, 2\).*got 0.5"):
        plan.rank_micro_batches(0.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"consumed micro-batches must be in .* got 1.5"):
        plan.consumed_ids(1.5)  # type: ignore[arg-type]
    with pytest.raises(SettingTypeError, match=r"num_examples must be a positive integer, got 2.5"):
        wmt_like_lengths(2.5)  # type: ignore[arg-type]


def test_more_loss_tokens_than_tokens_is_refused() -> None:
    lengths = np.array([3, 5, 2, 7])
    with pytest.raises(ValueError, match=r"loss_lengths\[0\] = 30 is more than the 3 tokens"):
        plan_epoch(lengths, 64, loss_lengths=lengths * 10)
    pairs = np.array([[3, 4], [5, 2]])
    plan = plan_epoch(pairs, 64, loss_lengths=np.array([3, 1]))  # target - 1: fine
    assert int(plan.step_tokens.sum()) == 4


def test_data_source_with_fewer_items_than_lengths_is_named() -> None:
    items = [{"tokens": [1] * 4}] * 3
    news = DataSource(np.full(4, 4), dataset=items, name="news")
    with pytest.raises(ValueError, match=r"Dataset 'news' \(index 1\): its dataset has 3 items"):
        MixturePlanner([np.full(8, 4), news], PlanConfig(16))


def test_unwritable_png_names_the_path(
    lengths_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    target = folder / "plan.png"
    target.mkdir()  # a directory where the file should go: the write fails
    code, _, err = _cli(
        ["--lengths", str(lengths_file), "--max-tokens", "20", "--png", str(folder / "plan")],
        capsys,
    )
    assert code == 2
    assert f"--png {str(target)!r}" in err
