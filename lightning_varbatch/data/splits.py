"""What both DataModules share about their splits: the evaluation rule and errors.

Both DataModules plan their validation and test splits with :func:`evaluation_config`
(``shuffle=False, tail="spread"``: every example exactly once) and check them with
:func:`check_evaluation` (at least one example per rank, none repeated or dropped);
:func:`split_error` names a planning error after its DataModule argument (``.stage``: the split).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_varbatch.data.plan_settings import plain_settings
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.errors import SettingError, SettingValueError
from lightning_varbatch.planner.settings import PlanConfig

__all__ = [
    "EVALUATION_SETTINGS",
    "STAGES",
    "check_evaluation",
    "evaluation_config",
    "split_error",
]

STAGES = ("train", "val", "test")
#: The settings every evaluation split is planned with, whatever the training ones.
EVALUATION_SETTINGS: dict[str, Any] = {"shuffle": False, "tail": "spread"}


def evaluation_config(budget: int, settings: Mapping[str, Any]) -> PlanConfig:
    """The planner settings of a validation or test split: ``settings`` with the eval rule.

    ``"spread"``: each example exactly once (``"pad"`` repeats, ``"drop"`` leaves out); no shuffle.

    Example:
        >>> evaluation_config(8, {"tail": "drop"}).tail
        'spread'
    """
    kept = {k: v for k, v in settings.items() if k not in EVALUATION_SETTINGS}
    return PlanConfig(**plain_settings(max_tokens=budget, **kept, **EVALUATION_SETTINGS))


def check_evaluation(stage: str, sampler: TokenBudgetBatchSampler) -> None:
    """An evaluation plan must see every example exactly once across the ranks.

    Raises:
        SettingValueError: for fewer examples than ranks (``setting`` is ``f"{stage}_dataset"``).
        RuntimeError: for a plan that repeats or drops examples.

    Example:
        >>> s = TokenBudgetBatchSampler([3], 8, rank=0, world_size=2, shuffle=False)
        >>> check_evaluation("val", s)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_varbatch.errors.SettingValueError: val_dataset has 1 examples for 2 ranks: ...
    """
    n = sampler.planner.num_examples
    if n < sampler.world_size:
        raise SettingValueError(
            f"{stage}_dataset has {n} examples for {sampler.world_size} ranks: every "
            "rank needs at least one to evaluate each example exactly once; use fewer "
            "devices for evaluation or a larger dataset.",
            setting=f"{stage}_dataset",
            value=n,
            stage=stage,
        )
    plan = sampler.plan
    if plan.num_duplicated or plan.num_dropped:
        raise RuntimeError(
            f"The {stage} plan repeats {plan.num_duplicated} and drops "
            f"{plan.num_dropped} examples; evaluation must see each exactly once."
        )


def split_error(
    error: SettingError,
    stage: str,
    budget: int,
    *,
    budget_default: bool,
    longest: int | None = None,
) -> SettingError:
    """``error`` of the planner, renamed after the DataModule argument of ``stage``.

    The planner's ``lengths`` and ``loss_lengths`` are the DataModule's ``{stage}_lengths``
    and ``{stage}_loss_lengths``; its ``max_tokens`` is ``val_max_tokens`` for evaluation
    (``budget``; ``budget_default``: left to default to ``max_tokens``; ``longest``: the
    split's longest length, for the message). Raise the result ``from`` ``error``.

    Example:
        >>> inner = SettingValueError("max_tokens=4 ...", setting="max_tokens", value=4)
        >>> outer = split_error(inner, "val", 4, budget_default=True)
        >>> outer.setting, outer.stage, "(it defaults to max_tokens)" in str(outer)
        ('val_max_tokens', 'val', True)
    """
    text = str(error)
    if error.setting in ("lengths", "loss_lengths"):
        name = f"{stage}_{error.setting}"
        return error.renamed(name, f"{name}: {text}", stage=stage)
    if error.setting == "max_tokens" and stage != "train":
        # the planner's text names its own setting, max_tokens: say it in this split's terms
        default = " (it defaults to max_tokens)" if budget_default else ""
        facts = "" if longest is None else f"its longest example has length {longest}, and "
        return error.renamed(
            "val_max_tokens",
            f"{stage}_dataset cannot be planned with val_max_tokens={budget}, the budget of "
            f"validation and test micro-batches{default}: {facts}examples longer than one "
            "micro-batch of that budget can hold cannot be evaluated: raise val_max_tokens "
            "(evaluation sees every example once, so none may be over it), or shorten the "
            f"{stage} examples before planning.",
            value=budget,
            stage=stage,
        )
    return error.renamed(error.setting, text, stage=stage)
