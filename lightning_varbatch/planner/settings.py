"""The planner's settings, validated once.

Example:
    >>> from lightning_varbatch.planner.settings import PlanConfig
    >>> PlanConfig(max_tokens=4096, max_examples=128).max_examples
    128
"""

from __future__ import annotations

import hashlib
import json
import textwrap
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal, TypeAlias

import numpy as np

from lightning_varbatch.checks import check_choice, check_count, check_flag, check_real
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.costs import COST_NAMES, CostFn, CostName, resolve_cost
from lightning_varbatch.planner.length_warmup import (
    WARMUP_DEFAULTS,
    ScheduleFn,
    ScheduleName,
    check_warmup_settings,
    schedule_values,
)
from lightning_varbatch.planner.rank_shares import check_rank_settings, rank_budgets

TailPolicy: TypeAlias = Literal["spread", "drop", "pad"]
LayoutName: TypeAlias = Literal["padded", "packed"]
LAYOUTS: tuple[str, ...] = ("padded", "packed")
#: ``flop_attention`` default: a causal Transformer with d_model = 1024 (see
#: :func:`lightning_varbatch.planner.flops.transformer_flops`): 2·d per (query, key) pair
#: against 24·d² per token through the linear layers, 1 / (12 · 1024).
DEFAULT_FLOP_ATTENTION = 1 / (12 * 1024)
OversizePolicy: TypeAlias = Literal["error", "skip", "truncate"]
TAIL_POLICIES: tuple[str, ...] = ("spread", "drop", "pad")
OVERSIZE_POLICIES: tuple[str, ...] = ("error", "skip", "truncate")
#: Settings added after checkpoints were first saved, with their defaults: at its default such
#: a setting is left out of :meth:`PlanConfig.plain` and :meth:`PlanConfig.fingerprint`, so the
#: fingerprints and saved states of plans made without it are unchanged (they still resume).
LATER_SETTINGS: dict[str, Any] = {
    "loss_offset": 0,
    **WARMUP_DEFAULTS,
    "rank_shares": None,
    "rank_max_tokens": None,
}
#: Settings that say how the work is shared between ranks, not which examples go together:
#: like the world size, they are left out of :meth:`PlanConfig.fingerprint` and
#: :meth:`PlanConfig.plain`, so a checkpoint resumes when they change (the rest of the epoch
#: keeps the saved plan's budgets, the next epoch takes the new ones).
RANK_SETTINGS: tuple[str, ...] = ("rank_shares", "rank_max_tokens")


def _probe_cost(fn: CostFn) -> None:
    """Call a custom cost model once on two candidates and check what comes back.

    Raises:
        SettingValueError: when it fails, returns the wrong shape, or non-finite / negative
            costs.
    """
    n, longest, total = np.array([1, 2]), np.array([8, 8]), np.array([8, 16])
    try:
        out = np.asarray(fn(n, longest, total), dtype=np.float64)
    except Exception as err:  # any failure of user code is reported the same way
        raise SettingValueError(
            f"cost= raised {type(err).__name__}: {err} when called as cost(num_examples, "
            "longest, total) on numpy arrays of two candidates; a cost model must work "
            "elementwise on arrays (e.g. lambda n, longest, total: n * longest).",
            setting="cost",
            value=fn,
        ) from err
    if out.shape != n.shape or not np.isfinite(out).all() or (out < 0).any():
        raise SettingValueError(
            f"cost= returned {out.tolist()!r} (shape {out.shape}) for two candidate "
            "micro-batches: a cost model must return one finite cost >= 0 per candidate, an "
            "array shaped like num_examples (e.g. lambda n, longest, total: n * longest).",
            setting="cost",
            value=fn,
        )


def _help(text: str) -> dict[str, str]:
    """A field's help text, its one definition: the docstring and the CLI flags read it."""
    return {"help": " ".join(text.split())}


@dataclass(frozen=True)
class PlanConfig:
    """How to cut an epoch into token-budgeted micro-batches.

    Every setting is a field below; its help text is defined once, in the field's metadata
    (``dataclasses.fields(PlanConfig)[i].metadata["help"]``), and is what the ``Args``
    section of this docstring and the plan command's flags (``python -m
    lightning_varbatch.plan --help``) show.

    Args:
        {fields}

    Raises:
        SettingTypeError: for a setting of the wrong type (also a ``ValueError``).
        SettingValueError: for a setting out of range or a combination that cannot work;
            ``.setting`` names it and the message says what to change.

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
            examples of the last, partial optimizer step into exactly that many even
            micro-batches, so nothing is lost and its ranks stay balanced (only when there
            are fewer examples than micro-batches needed does it repeat some, counted);
            ``"drop"`` drops randomly chosen micro-batches (counted); ``"pad"`` repeats
            randomly chosen micro-batches (counted)"""
        ),
    )
    layout: LayoutName = field(
        default="padded",
        metadata=_help(
            """``"padded"`` (default): each micro-batch is a padded (examples x longest)
            batch; ``"packed"``: each micro-batch is one packed row of whole examples (no
            padding but the row's alignment to ``pad_to_multiple_of``), its real tokens
            within ``max_tokens`` (the ``"packed"`` cost), and each optimizer step's
            micro-batches are dealt to ranks by their FLOPs (``flop_attention``), not their
            tokens; use it with :class:`~lightning_varbatch.data.packed_collate.PackingCollate`
            and one length per example (with ``bucket_width > 1`` each epoch's rows are cut
            after the shuffle on the exact lengths, so they fill to the budget as with 1)"""
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
            padded to one of at most this many static ``(rows, length)`` shapes, the lengths
            chosen to pad least (:mod:`lightning_varbatch.planner.shapes`); each micro-batch
            takes the shape of its longest example, and only the tail's micro-batches have
            masked rows, which count in no total (``None``: free shapes); needs
            ``layout="padded"``, ``cost`` ``"padded"`` or ``"quadratic"``, ``bucket_width=1``
            and ``batch_size_multiple=1``"""
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
            """loss tokens of every example are derived from its length (the target's for
            pairs) minus this, at least 0, counted after ``oversize="truncate"`` cuts it: 1
            for teacher forcing / next-token prediction, as ``PaddingCollate(loss_offset=1)``
            and ``PackingCollate``'s shifted labels count them (0: the length itself); not
            with explicit ``loss_lengths``, which are the loss tokens already"""
        ),
    )

    length_warmup: int | None = field(
        default=None,
        metadata=_help(
            """sequence-length warm-up over the first this many optimizer steps of the run
            (epoch 0): the longest example a step may hold grows from ``length_warmup_min``
            to ``length_warmup_max`` along ``length_warmup_schedule``; nothing is cut, longer
            examples run in later steps of the epoch, every step keeps its token budget
            (``None``: no warm-up; see docs/length-warmup.md)"""
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
        if isinstance(self.cost, str):
            check_choice(
                "cost",
                self.cost,
                COST_NAMES,
                what=" or a callable (num_examples, longest, total) -> cost",
            )
        elif not callable(self.cost):
            raise SettingTypeError(
                f"cost must be one of {', '.join(repr(c) for c in COST_NAMES)} or a callable "
                f"(num_examples, longest, total) -> cost, got {self.cost!r} "
                f"({type(self.cost).__name__}); pass e.g. cost='padded'.",
                setting="cost",
                value=self.cost,
            )
        if self.layout == "packed":
            if self.cost not in ("padded", "packed"):
                raise SettingValueError(
                    f"layout='packed' budgets the real tokens of a packed row itself, so "
                    f"cost={self.cost!r} cannot apply: leave cost unset with layout='packed' "
                    "(or use layout='padded' for another cost model).",
                    setting="cost",
                    value=self.cost,
                )
            object.__setattr__(self, "cost", "packed")
        elif self.cost == "packed":
            raise SettingValueError(
                "cost='packed' is the budget of packed rows: set layout='packed' instead of "
                "cost='packed' (the collate and the rank balance change with it).",
                setting="cost",
                value=self.cost,
            )
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
            self._check_shape_budget()
        if not isinstance(self.cost, str):
            _probe_cost(self.cost)
        for name, value in check_warmup_settings(self).items():
            object.__setattr__(self, name, value)
        for name, value in check_rank_settings(self).items():
            object.__setattr__(self, name, value)

    def rank_budgets(
        self, world_size: int, shares: Sequence[float] | None = None
    ) -> tuple[int, ...] | None:
        """Every rank's micro-batch budget for ``world_size`` ranks (``None``: all ``max_tokens``).

        Args:
            world_size: the number of ranks.
            shares: shares to use instead of ``rank_shares`` (set by a run, e.g. balancing).

        Raises:
            SettingValueError: when ``rank_shares`` / ``rank_max_tokens`` do not have one
                entry per rank.

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

    def _check_shape_budget(self) -> None:
        """Refuse the settings a shape budget cannot keep (``max_shapes`` is set)."""
        clashes = {
            "layout": (self.layout != "padded", "a packed row already has one shape"),
            "cost": (
                self.cost not in ("padded", "quadratic"),
                "a shape's rows are priced by their count, so the cost must be 'padded' or "
                "'quadratic'",
            ),
            "bucket_width": (self.bucket_width != 1, "the shapes are the buckets"),
            "batch_size_multiple": (
                self.batch_size_multiple != 1,
                "each shape's rows are fixed at the most that fit; pick max_tokens so they "
                "are the multiple you want",
            ),
        }
        for name, (clash, why) in clashes.items():
            if clash:
                raise SettingValueError(
                    f"max_shapes={self.max_shapes} cannot be combined with {name}="
                    f"{getattr(self, name)!r}: {why}. Leave {name} at its default or unset "
                    "max_shapes.",
                    setting="max_shapes",
                    value=self.max_shapes,
                )

    @property
    def cost_fn(self) -> CostFn:
        """The resolved, vectorised cost function."""
        return resolve_cost(
            self.cost, quadratic_coef=self.quadratic_coef, multiple=self.pad_to_multiple_of
        )

    def loss_tokens(self, target: np.ndarray, truncate_to: int | None = None) -> np.ndarray:
        """Every example's loss tokens, derived from its length with ``loss_offset``.

        The one rule the planner counts by, matching what the library's collates count:

        * padded batches (``layout="padded"``, also with ``max_shapes``): the collate cuts the
          field to ``truncate_to`` first, then the loss predicts all but ``loss_offset`` of
          its tokens (``PaddingCollate(loss_offset=k)``): ``max(min(L, T) - k, 0)``;
        * packed rows (``layout="packed"``): ``PackingCollate`` labels each kept token with
          the next token of the *whole* example, so a cut example keeps a label on its last
          kept token: ``max(min(L - k, T), 0)``.

        Args:
            target: the loss-side length of every example (the target's for pairs), before
                truncation.
            truncate_to: the length over-budget examples are cut to (``None``: none cut).

        Returns:
            ``int64`` loss tokens, one per example (``target`` itself when ``loss_offset`` is
            0 and nothing is cut).

        Example:
            >>> import numpy as np
            >>> lengths = np.array([1, 5, 9])
            >>> PlanConfig(8, loss_offset=1).loss_tokens(lengths, truncate_to=6).tolist()
            [0, 4, 5]
            >>> PlanConfig(8, loss_offset=1, layout="packed").loss_tokens(lengths, 6).tolist()
            [0, 4, 6]
        """
        length = np.asarray(target).astype(np.int64)
        k = self.loss_offset
        if truncate_to is None:
            return np.maximum(length - k, 0)
        if self.layout == "packed":
            return np.maximum(np.minimum(length - k, truncate_to), 0)
        return np.maximum(np.minimum(length, truncate_to) - k, 0)

    def check_loss_lengths(self, loss_lengths: object) -> None:
        """Refuse explicit ``loss_lengths`` together with a ``loss_offset``.

        ``loss_lengths`` are the loss tokens themselves; ``loss_offset`` derives them from the
        lengths. Both at once would subtract the offset twice (``loss_lengths = lengths - 1``
        kept from before, plus ``loss_offset=1``), or disagree with the collate, which
        subtracts the offset from every example's real tokens.

        Raises:
            SettingValueError: (``.setting``: ``"loss_offset"``) when both are given.

        Example:
            >>> PlanConfig(8, loss_offset=1).check_loss_lengths(None)  # derived: fine
        """
        if loss_lengths is None or not self.loss_offset:
            return
        raise SettingValueError(
            f"loss_offset={self.loss_offset} derives every example's loss tokens from its "
            "length (after truncation), but loss_lengths were given too: pass one of them. "
            "For teacher forcing drop loss_lengths (e.g. lengths - 1) and keep "
            f"loss_offset={self.loss_offset}; for loss tokens counted another way keep "
            "loss_lengths and leave loss_offset=0.",
            setting="loss_offset",
            value=self.loss_offset,
        )

    def plain(self) -> dict[str, Any]:
        """Every setting as a plain value (a custom cost by its name), to say what changed.

        A setting of :data:`LATER_SETTINGS` at its default is left out (states saved before it
        existed compare equal), and so are :data:`RANK_SETTINGS` (a resume may change them).

        Example:
            >>> def slots(n, longest, total):
            ...     return n * longest
            >>> PlanConfig(8).plain()["max_tokens"], PlanConfig(8, cost=slots).plain()["cost"]
            (8, 'slots')
        """
        out: dict[str, Any] = {}
        for name, value in vars(self).items():
            if name in RANK_SETTINGS or (name in LATER_SETTINGS and value == LATER_SETTINGS[name]):
                continue  # as before the setting existed: saved states compare equal
            if callable(value):
                value = getattr(value, "__qualname__", repr(value))
                if name == "length_warmup_schedule":  # what it is: its values
                    value += (
                        f" ({schedule_values(self.length_warmup_schedule, self.length_warmup)})"
                    )
            keep = isinstance(value, (bool, int, float, str, type(None)))
            out[name] = value if keep else str(value)
        return out

    def fingerprint(self) -> str:
        """A short hash of every setting that changes the plan (for checkpoint checks).

        Example:
            >>> PlanConfig(8).fingerprint() == PlanConfig(8).fingerprint()
            True
        """
        values = asdict(self)
        # Settings added later leave the fingerprint of plans made without them unchanged, so
        # checkpoints saved before they existed still resume.
        if self.layout == "padded":
            del values["layout"], values["flop_attention"]
        if self.max_shapes is None:
            del values["max_shapes"]
        for name, default in LATER_SETTINGS.items():
            if values[name] == default or name in RANK_SETTINGS:
                del values[name]
        if "cost" in values and callable(values["cost"]):
            values["cost"] = getattr(values["cost"], "__qualname__", repr(values["cost"]))
        if "length_warmup_schedule" in values:  # a callable by its values
            values["length_warmup_schedule"] = schedule_values(
                self.length_warmup_schedule, self.length_warmup
            )
        blob = json.dumps(values, sort_keys=True, default=str).encode()
        return hashlib.sha1(blob).hexdigest()[:16]


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
