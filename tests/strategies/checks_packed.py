"""Checks of the ``packed`` phase: padding-free rows of whole documents.

The phase plans with ``layout="packed"`` and ``loss_lengths = lengths - 1``, collates each
micro-batch into one row (``PackingCollate``), runs a causal attention model through
``document_attention`` and normalises with ``step_token_mean``. Its update equals the float64
update of every document of the step run alone (``checks_training``); here: the rows hold whole
documents and count their labels, and the equivalence can fail (a leak across documents, or
each row's own mean, is measurably another update).
"""

from __future__ import annotations

from typing import ClassVar

import pytest

from tests.scripts.strategy_common import ACCUMULATE, MAX_TOKENS, make_sequences
from tests.strategies._reference import packed_reference_update, step_micro_batches
from tests.strategies.checks_training import TOLERANCE, max_update_error
from tests.strategies.runs import STEPS, WORLD_SIZE, Launch, Run


class Packed:
    """The checks of a launch's ``packed`` phase."""

    LAUNCH: ClassVar[Launch]

    def test_packed_rows_hold_whole_documents_and_count_their_labels(self, run: Run) -> None:
        records = run.phase("packed")
        lengths = [len(s) for s in make_sequences()]
        for r in records:
            for m in r["micro_batches"]:
                docs = [lengths[i] for i in m["ids"]]
                # One padding-free row of whole documents, within the budget.
                assert m["row_shape"] == [1, sum(docs)] and sum(docs) <= MAX_TOKENS, m
                bounds = [0]
                for n in docs:
                    bounds.append(bounds[-1] + n)
                assert m["cu_seqlens"] == bounds and m["max_seqlen"] == max(docs), m
                # Labels: each document's length minus one, what the plan counted.
                assert m["ntokens"] == m["labelled"] == sum(n - 1 for n in docs), m
        # Rows pack several documents (the update checked, step 0's, has boundaries to respect).
        rows = [m for r in records for m in r["micro_batches"]]
        assert sum(len(m["ids"]) > 1 for m in rows) > len(rows) // 2
        for r in records:
            assert any(len(m["ids"]) > 1 for m in r["micro_batches"] if m["step"] == 0)
        # The step's loss tokens, known to every rank from the plan, are the sum over all rows.
        for step in range(STEPS):
            rows = [m for r in records for m in r["micro_batches"] if m["step"] == step]
            assert len(rows) == WORLD_SIZE * ACCUMULATE
            assert {m["step_ntokens"] for m in rows} == {sum(m["ntokens"] for m in rows)}

    @pytest.mark.parametrize("mistake", ["naive", "leak"])
    def test_packed_update_misses_a_leak_or_the_naive_mean(self, run: Run, mistake: str) -> None:
        # The packed equivalence can fail: attention across the row's documents ("leak"), or
        # each row's own token mean averaged over rows ("naive"), is measurably another update.
        records = run.phase("packed")
        micro_batches = step_micro_batches(records, 0)
        wrong = packed_reference_update(records[0]["init"], micro_batches, mode=mistake)
        errors = max_update_error(records, wrong)
        assert max(errors.values()) > 100 * TOLERANCE["atol"], errors
