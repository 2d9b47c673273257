"""The planner's settings, validated once.

Example:
    >>> PlanConfig(max_tokens=4096, max_examples=128).max_examples
    128
"""

from __future__ import annotations

import textwrap
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TypeAlias

from lightning_varbatch.checks import check_choice, check_count, check_flag, check_real
from lightning_varbatch.errors import SettingTypeError
from lightning_varbatch.planner.batch_schedule import check_schedule_setting
from lightning_varbatch.planner.costs import CostFn, CostName, check_cost, resolve_cost
from lightning_varbatch.planner.length_warmup import ScheduleFn, ScheduleName, check_warmup_settings
from lightning_varbatch.planner.pair_order import PAIR_ORDERS, PairOrder
from lightning_varbatch.planner.rank_shares import check_rank_settings, rank_budgets
from lightning_varbatch.planner.settings_identity import fingerprint_of, plain_settings
from lightning_varbatch.planner.shape_settings import check_shape_settings

TailPolicy: TypeAlias = Literal["spread", "drop", "pad"]
LayoutName: TypeAlias = Literal["padded", "packed"]
LAYOUTS: tuple[str, ...] = ("padded", "packed")
#: ``flop_attention`` default: a causal Transformer, d_model = 1024 (:func:`~.transformer_flops`):
#: 2·d per (query, key) pair against 24·d² per token in the linear layers, 1 / (12 · 1024).
DEFAULT_FLOP_ATTENTION = 1 / (12 * 1024)
OversizePolicy: TypeAlias = Literal["error", "skip", "truncate"]
TAIL_POLICIES: tuple[str, ...] = ("spread", "drop", "pad")
OVERSIZE_POLICIES: tuple[str, ...] = ("error", "skip", "truncate")


def _help(text: str) -> dict[str, str]:
    """A field's help text, its one definition: the docstring and the CLI flags read it."""
    return {"help": " ".join(text.split())}


@dataclass(frozen=True)
class PlanConfig:
    """How to cut an epoch into token-budgeted micro-batches.

    Help texts live once, in the fields' metadata: this ``Args`` section and the plan CLI show them.

    Args:
        {fields}

    Raises:
        SettingTypeError: for a setting of the wrong type (also a ``ValueError``).
        SettingValueError: for a setting out of range or a bad combination (named, with the fix).

    Example:
        >>> PlanConfig(max_tokens=16384, cost="quadratic", tail="drop").tail
        'drop'
    """

    max_tokens: int = field(
        metadata=_help(
            """the budget of one micro-batch on one rank, in the units of ``cost`` (for
            ``"padded"``: examples x longest padded length, fairseq's ``--max-tokens``)"""
        )
    )
    max_examples: int | None = field(
        default=None,
        metadata=_help("at most this many examples per micro-batch (``None``: no cap)"),
    )
    cost: CostName | CostFn = field(
        default="padded",
        metadata=_help(
            """the cost model: ``"padded"`` (default), ``"sum"``, ``"quadratic"`` or a
            callable ``(num_examples, longest, total) -> cost``; see
            :mod:`lightning_varbatch.planner.costs`"""
        ),
    )
    quadratic_coef: float = field(
        default=1 / 64,
        metadata=_help("``c`` in the quadratic cost model ``n * (L + c * L**2)``"),
    )
    batch_size_multiple: int = field(
        default=1,
        metadata=_help(
            """round the number of examples of a micro-batch down to a multiple of this
            (e.g. 8 for tensor cores) when it holds at least that many"""
        ),
    )
    pad_to_multiple_of: int = field(
        default=1,
        metadata=_help(
            """lengths are padded up to a multiple of this; the cost model sees the padded
            length"""
        ),
    )
    bucket_width: int = field(
        default=1,
        metadata=_help(
            """examples whose lengths fall in the same ``bucket_width``-wide bucket are mixed
            freely (1: exact length sorting, the tightest padding; larger values add
            randomness at the price of padding, budgeted with the bucket's longest example)"""
        ),
    )
    pair_order: PairOrder = field(
        default="two_sided",
        metadata=_help(
            """how (source, target) pairs of one planning length are ordered:
            ``"two_sided"`` (default) by ``source - target``, so that each side pads to its
            own longest less (:mod:`~lightning_varbatch.planner.pair_order`); ``"max"``: by
            ``max(source, target)`` only (the order of plans before it existed). The same
            budget on each side, at most 1 % more micro-batches; ranks balanced by both sides'
            padded slots; no effect on one length per example"""
        ),
    )
    shuffle: bool = field(
        default=True,
        metadata=_help(
            """shuffle examples of equal bucket and the order of optimizer steps each epoch"""
        ),
    )
    seed: int = field(default=0, metadata=_help("the plan depends only on ``seed`` and the epoch"))
    tail: TailPolicy = field(
        default="spread",
        metadata=_help(
            """what to do when the number of micro-batches is not a multiple of
            ``world_size * accumulate_grad_batches``: ``"spread"`` (default) re-cuts the
            examples of the last, partial step into exactly that many even micro-batches:
            every example once, its ranks balanced (it repeats some, counted, only where the
            examples left cannot fill whole steps within the budget: fewer examples than
            micro-batches needed); ``"drop"`` drops random micro-batches, never repeats;
            ``"pad"`` repeats random micro-batches, never drops (both counted, also in the
            re-planned rest of an epoch)"""
        ),
    )
    layout: LayoutName = field(
        default="padded",
        metadata=_help(
            """``"padded"`` (default): each micro-batch is a padded (examples x longest)
            batch; ``"packed"``: one packed row of whole examples, its real tokens within
            ``max_tokens``, each step's rows dealt to ranks by their FLOPs
            (``flop_attention``); one length per example, with ``PackingCollate``"""
        ),
    )
    flop_attention: float = field(
        default=DEFAULT_FLOP_ATTENTION,
        metadata=_help(
            """the compute of one (query, key) pair of attention relative to one token through
            the linear layers: a packed micro-batch costs ``sum(L) + flop_attention *
            sum(L**2)`` when ranks are balanced (``layout="packed"``; derive it from your
            model with ``transformer_flops(d_model).flop_attention``; 0 balances tokens)"""
        ),
    )
    max_shapes: int | None = field(
        default=None,
        metadata=_help(
            """the shape budget for ``torch.compile`` and CUDA graphs: every micro-batch is
            padded to one of at most this many static ``(rows, length)`` shapes chosen to pad
            least (:mod:`lightning_varbatch.planner.shapes`; ``None``: free shapes); needs
            ``layout="padded"``, the padded or quadratic cost, ``bucket_width=1`` and
            ``batch_size_multiple=1``"""
        ),
    )
    oversize: OversizePolicy = field(
        default="error",
        metadata=_help(
            """what to do with an example that does not fit the budget on its own:
            ``"error"`` (default), ``"skip"`` (counted) or ``"truncate"`` (to the longest
            length that fits; the collate cuts the tokens)"""
        ),
    )
    loss_offset: int = field(
        default=0,
        metadata=_help(
            """every example's loss tokens are its length (the target's for pairs, after
            ``oversize="truncate"``) minus this, at least 0: 1 for teacher forcing, as the
            collates count them; not with explicit ``loss_lengths``"""
        ),
    )

    length_warmup: int | None = field(
        default=None,
        metadata=_help(
            """sequence-length warm-up over the first this many optimizer steps of the run:
            the longest example a step may hold grows from ``length_warmup_min`` to
            ``length_warmup_max``; nothing is cut (``None``: none; docs/length-warmup.md)"""
        ),
    )
    length_warmup_min: int = field(
        default=8,
        metadata=_help(
            """the cap on the planning length (``max(source, target)`` for pairs) at the
            first step of the warm-up"""
        ),
    )
    length_warmup_max: int | None = field(
        default=None,
        metadata=_help(
            """the cap the warm-up reaches at its end (``None``: the longest example); after
            the warm-up there is no cap"""
        ),
    )
    length_warmup_schedule: ScheduleName | ScheduleFn = field(
        default="linear",
        metadata=_help(
            """how the cap grows with the warm-up's progress ``p`` in [0, 1]: ``"linear"``,
            ``"root"`` (``√p``, Li et al. 2022), ``"step"`` (doubling in equal stages) or a
            callable ``p -> fraction`` of the way from the minimum to the maximum, in [0, 1]
            and non-decreasing"""
        ),
    )

    rank_shares: tuple[float, ...] | None = field(
        default=None,
        metadata=_help(
            """each rank's relative speed, one per rank (e.g. ``[1.0, 0.5]``: rank 1 half as
            fast): each rank's micro-batches are cut to a budget in proportion to it, so its
            work per step is too, while every rank runs the same number of micro-batches
            (``None``: equal; see docs/mixed-clusters.md); a run may change them between
            epochs (``RankShareBalancer``)"""
        ),
    )
    rank_max_tokens: tuple[int, ...] | None = field(
        default=None,
        metadata=_help(
            """each rank's own memory budget, one per rank, at most ``max_tokens`` (the
            largest micro-batch of any rank): no micro-batch of rank ``r`` costs more
            (``None``: ``max_tokens`` on every rank)"""
        ),
    )

    batch_schedule: str | None = field(
        default=None,
        metadata=_help(
            """the batch-size schedule: the fraction of the full step (every rank's budget
            times the accumulation) by tokens trained, as thresholds ``"0:0.25 2M:0.5 8M:1"``, a
            ramp ``"ramp:0.25:8M"``, ``(tokens, fraction)`` pairs or a callable; held as
            its canonical text (``None``: every step full; docs/batch-schedule.md)"""
        ),
    )

    def __post_init__(self) -> None:
        counts = {
            "max_tokens": check_count("max_tokens", self.max_tokens),
            "max_examples": check_count("max_examples", self.max_examples, allow_none=True),
            "batch_size_multiple": check_count("batch_size_multiple", self.batch_size_multiple),
            "pad_to_multiple_of": check_count("pad_to_multiple_of", self.pad_to_multiple_of),
            "bucket_width": check_count("bucket_width", self.bucket_width),
            "seed": check_count("seed", self.seed, minimum=0),
            "loss_offset": check_count("loss_offset", self.loss_offset, minimum=0),
        }
        for name, value in counts.items():  # numpy integers become Python ints
            object.__setattr__(self, name, value)
        object.__setattr__(self, "shuffle", check_flag("shuffle", self.shuffle))
        if self.max_examples is not None and self.batch_size_multiple > self.max_examples:
            warnings.warn(
                f"batch_size_multiple={self.batch_size_multiple} is larger than "
                f"max_examples={self.max_examples}: no micro-batch can hold a multiple of it, "
                "so it has no effect. Lower batch_size_multiple or raise max_examples.",
                UserWarning,
                stacklevel=3,
            )
        check_choice(
            "tail", self.tail, TAIL_POLICIES, what=" (what to do with a partial last step)"
        )
        check_choice("pair_order", self.pair_order, PAIR_ORDERS, what=" (how pairs are ordered)")
        check_choice(
            "oversize",
            self.oversize,
            OVERSIZE_POLICIES,
            what=" (what to do with an example over the budget)",
        )
        coef = check_real(
            "quadratic_coef",
            self.quadratic_coef,
            strict=False,
            what="; pass e.g. quadratic_coef=1/64 (0 makes the quadratic cost the padded one)",
        )
        object.__setattr__(self, "quadratic_coef", coef)
        check_choice(
            "layout",
            self.layout,
            LAYOUTS,
            what=" (padded batches, or packed rows of whole examples)",
        )
        object.__setattr__(self, "cost", check_cost(self.cost, self.layout))
        flops = check_real(
            "flop_attention",
            self.flop_attention,
            strict=False,
            what="; pass e.g. flop_attention=transformer_flops(d_model=1024).flop_attention "
            "(0: balance ranks by tokens only)",
        )
        object.__setattr__(self, "flop_attention", float(flops))
        if self.max_shapes is not None:
            object.__setattr__(self, "max_shapes", check_count("max_shapes", self.max_shapes))
            check_shape_settings(self)
        for name, value in check_warmup_settings(self).items():
            object.__setattr__(self, name, value)
        for name, value in check_rank_settings(self).items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "batch_schedule", check_schedule_setting(self))

    def rank_budgets(
        self, world_size: int, shares: Sequence[float] | None = None
    ) -> tuple[int, ...] | None:
        """Every rank's micro-batch budget for ``world_size`` ranks (``None``: all ``max_tokens``).

        Args:
            world_size: the number of ranks.
            shares: shares to use instead of ``rank_shares`` (set by a run, e.g. balancing).

        Raises:
            SettingValueError: when ``rank_shares`` / ``rank_max_tokens`` have the wrong length.

        Example:
            >>> PlanConfig(4096, rank_shares=(1, 0.5)).rank_budgets(2)
            (4096, 2048)
            >>> PlanConfig(4096).rank_budgets(2) is None
            True
        """
        shares = self.rank_shares if shares is None else shares
        if shares is None and self.rank_max_tokens is None:
            return None
        return rank_budgets(self.max_tokens, world_size, shares, self.rank_max_tokens)

    @property
    def cost_fn(self) -> CostFn:
        """The resolved, vectorised cost function."""
        return resolve_cost(
            self.cost, quadratic_coef=self.quadratic_coef, multiple=self.pad_to_multiple_of
        )

    def plain(self) -> dict[str, Any]:
        """Every setting as a plain value, to say what changed (see :func:`plain_settings`).

        Example:
            >>> def slots(n, longest, total):
            ...     return n * longest
            >>> PlanConfig(8).plain()["max_tokens"], PlanConfig(8, cost=slots).plain()["cost"]
            (8, 'slots')
        """
        return plain_settings(vars(self))

    def fingerprint(self) -> str:
        """A short hash of every setting that changes the plan (see :func:`fingerprint_of`)."""
        return fingerprint_of(asdict(self))


def check_config(config: object) -> PlanConfig:
    """A planner's ``config``: a :class:`PlanConfig`, or the one error that says so.

    Raises:
        SettingTypeError: for anything else (a dict of settings, say).
    """
    if not isinstance(config, PlanConfig):
        raise SettingTypeError(
            f"config must be a PlanConfig, got {type(config).__name__} {config!r:.60}; "
            "pass config=PlanConfig(max_tokens=...) (e.g. PlanConfig(**settings) for a "
            "dict).",
            setting="config",
            value=config,
        )
    return config


def _args_section() -> str:
    lines = []
    for f in fields(PlanConfig):
        body = textwrap.fill(
            f"{f.name}: {f.metadata['help']}.",
            width=88,
            subsequent_indent="            ",
            break_on_hyphens=False,  # "micro-batches" stays one word when the text is joined
        )
        lines.append(body)
    return "\n        ".join(lines)


if PlanConfig.__doc__:  # None under python -OO
    PlanConfig.__doc__ = PlanConfig.__doc__.replace("{fields}", _args_section())
