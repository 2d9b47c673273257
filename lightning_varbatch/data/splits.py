"""What both DataModules share about their splits: the evaluation rule, errors, state version.

:class:`~lightning_varbatch.TokenBudgetDataModule` and
:class:`~lightning_varbatch.StreamingDataModule` plan their validation and test splits with
:func:`evaluation_config` (``shuffle=False, tail="spread"``: every example exactly once) and
check them with :func:`check_evaluation` (at least one example per rank, none repeated or
dropped); :func:`split_error` names a planning error after the DataModule argument it came
from, with the split in ``.stage``; :func:`check_state_version` reads the version both
DataModules' states carry.

Example:
    >>> config = evaluation_config(64, {"seed": 3, "shuffle": True, "tail": "pad"})
    >>> config.shuffle, config.tail, config.max_tokens
    (False, 'spread', 64)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_varbatch.data.plan_settings import plain_settings
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.errors import ResumeMismatchError, SettingError, SettingValueError
from lightning_varbatch.planner.settings import PlanConfig

__all__ = [
    "EVALUATION_SETTINGS",
    "STAGES",
    "STATE_VERSION",
    "check_evaluation",
    "check_position_restored",
    "check_state_version",
    "evaluation_config",
    "split_error",
]

STAGES = ("train", "val", "test")
#: The settings every evaluation split is planned with, whatever the training ones.
EVALUATION_SETTINGS: dict[str, Any] = {"shuffle": False, "tail": "spread"}
#: The version of both DataModules' ``state_dict`` (a state without one is version 1).
STATE_VERSION = 1


def evaluation_config(budget: int, settings: Mapping[str, Any]) -> PlanConfig:
    """The planner settings of a validation or test split: ``settings`` with the eval rule.

    ``tail="pad"`` would evaluate some examples twice and ``"drop"`` leave some out;
    ``"spread"`` evaluates each exactly once. The order does not matter: ``shuffle=False``.

    Args:
        budget: the split's ``max_tokens`` (the DataModule's ``val_max_tokens``).
        settings: the training planner settings (``shuffle`` and ``tail`` are replaced).

    Example:
        >>> evaluation_config(8, {"tail": "drop"}).tail
        'spread'
    """
    kept = {k: v for k, v in settings.items() if k not in EVALUATION_SETTINGS}
    return PlanConfig(**plain_settings(max_tokens=budget, **kept, **EVALUATION_SETTINGS))


def check_evaluation(stage: str, sampler: TokenBudgetBatchSampler) -> None:
    """An evaluation plan must see every example exactly once across the ranks.

    Raises:
        SettingValueError: for fewer examples than ranks (``setting`` is
            ``f"{stage}_dataset"``).
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

    The planner's ``lengths`` and ``loss_lengths`` are the DataModule's
    ``{stage}_lengths`` and ``{stage}_loss_lengths``; its ``max_tokens`` is ``max_tokens``
    for training and ``val_max_tokens`` for validation and test. Raise the result ``from``
    ``error``.

    Args:
        error: the planner's setting error.
        stage: ``"train"``, ``"val"`` or ``"test"``.
        budget: the split's budget.
        budget_default: whether ``val_max_tokens`` was left to default to ``max_tokens``.
        longest: the split's longest planning length, for the message (``None``: unknown).

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


def check_state_version(owner: str, state: Mapping[str, Any]) -> None:
    """Accept a state of this version or one saved before states had a version.

    Raises:
        ResumeMismatchError: for another version (``changed == ["version"]``), naming it.

    Example:
        >>> check_state_version("X", {"version": 1}), check_state_version("X", {})
        (None, None)
    """
    version = state.get("version", STATE_VERSION)
    if version != STATE_VERSION:
        raise ResumeMismatchError(
            f"The {owner} state has version {version!r}, but this lightning_varbatch reads "
            f"version {STATE_VERSION} (and states saved before versions existed): the "
            "checkpoint was saved by another release; resume it with that release.",
            changed=["version"],
        )


def check_position_restored(trainer: Any, owner: str, restored: bool) -> None:
    """Refuse a mid-epoch resume whose checkpoint gave this DataModule no position.

    Lightning keeps a DataModule's state under its class name (``__qualname__``) and hands it
    back only to a DataModule of the same name: a checkpoint saved by a subclass, a renamed
    class or the other DataModule resumes the fit loop mid-epoch while the DataModule starts
    the epoch from its first micro-batch, training part of the epoch twice and silently.

    Args:
        trainer: the Trainer (``None`` outside one: nothing to check).
        owner: the DataModule's class name, for the message.
        restored: whether its ``load_state_dict`` ran for this fit.

    Raises:
        ResumeMismatchError: when the fit resumes from ``ckpt_path`` with micro-batches of the
            epoch already trained and ``restored`` is false (``changed == ["datamodule"]``).

    Example:
        >>> check_position_restored(None, "TokenBudgetDataModule", restored=False)
    """
    if trainer is None or restored or getattr(trainer, "ckpt_path", None) is None:
        return
    trained = int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
    # Lightning's own judgement (FitLoop.restarting, set when the loops' state is loaded): it
    # resumes inside an epoch (its started count ahead of processed, or max_steps training).
    # A checkpoint of a finished epoch needs no position.
    if trained == 0 or not trainer.fit_loop.restarting:
        return
    raise ResumeMismatchError(
        f"The fit resumes from ckpt_path={trainer.ckpt_path} after {trained} micro-batches of "
        f"epoch {int(trainer.fit_loop.epoch_progress.current.processed)}, but the checkpoint "
        f"holds no {owner} state: Lightning keeps a DataModule's state under its class name, "
        "and this checkpoint was saved by a DataModule of another class (a subclass, a renamed "
        "class, or the other of TokenBudgetDataModule and StreamingDataModule). Without its "
        "position the epoch would start again and train examples twice. Resume with the class "
        "that saved it, or load its position before fit: "
        "dm.load_state_dict(torch.load(ckpt_path, weights_only=True)['<that class name>']).",
        changed=["datamodule"],
    )
