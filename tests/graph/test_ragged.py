"""Ragged fan-out: a list per element, one batched model call over every row, per-row reduce."""
from __future__ import annotations

import numpy as np
import pytest

import outlines
from outlines import models
from outlines.graph.ragged import Ragged
from tests.fixtures.recording import RecordingBackend

DOCUMENTS = ["a|b", "c|d|e", "f", "g|h|i|j", "k|l"]


def bracket(prompt: str) -> str:
    return f"<{prompt}>"


@outlines.fn(signature="()->(n)")
def paragraphs(document):
    return document.split("|")


@outlines.prompt
def summarize(paragraph):
    """S {{ paragraph }}"""


@outlines.prompt
def combine(summaries):
    """C {{ summaries | join(",") }}"""


def test_ragged_values_hold_rows_flat():
    rows = Ragged.from_rows([["a", "b"], [], ["c"]])
    assert rows.shape == (3, None) and rows.values.tolist() == ["a", "b", "c"]
    assert rows.tolist() == [["a", "b"], [], ["c"]] and len(rows) == 3
    assert [r.tolist() for r in rows.rows()] == [["a", "b"], [], ["c"]]


def test_ragged_map_reduce_sends_one_batch_per_level():
    log = RecordingBackend(bracket, name="log")
    llm = log.model()
    documents = outlines.string("documents")
    parts = paragraphs(documents)
    summaries = llm(summarize(parts))
    assert parts.ragged and summaries.ragged
    final = llm(combine(summaries))
    assert not final.ragged
    result = final.eval({documents: DOCUMENTS}, cache=False)
    assert [len(b) for b in log.batches] == [12, 5]  # every paragraph of every document at once
    assert log.batches[0][:3] == ["S a", "S b", "S c"]
    assert result.tolist() == ["<C <S a>,<S b>>", "<C <S c>,<S d>,<S e>>", "<C <S f>>",
                               "<C <S g>,<S h>,<S i>,<S j>>", "<C <S k>,<S l>>"]


def test_ragged_rows_pair_with_their_own_document_and_keep_samples():
    llm = models.from_function(lambda p: p.upper(), name="upper")
    documents = outlines.string("documents")
    parts = paragraphs(documents)
    tagged = documents + ":" + parts  # a (D,) value pairs with each row of its own document
    value = tagged.eval({documents: ["x|y", "z"]}, cache=False)
    assert isinstance(value, Ragged) and value.tolist() == [["x|y:x", "x|y:y"], ["z:z"]]
    samples = llm(parts, num_samples=2).eval({documents: ["x|y", "z"]}, cache=False)
    assert samples.shape == (2, None, 2) and samples.tolist() == [[["X", "X"], ["Y", "Y"]], [["Z", "Z"]]]


def test_reduce_each_row_with_a_core_signature():
    @outlines.fn(signature="(n)->()")
    def count(items):
        return len(items)

    documents = outlines.string("documents")
    counts = count(paragraphs(documents)).eval({documents: DOCUMENTS})
    assert counts.tolist() == [2, 3, 1, 4, 2]


def test_equal_lengths_stay_a_regular_array():
    documents = outlines.string("documents")
    value = paragraphs(documents).eval({documents: ["a|b", "c|d"]})
    assert isinstance(value, np.ndarray) and value.shape == (2, 2)


def test_indexing_a_ragged_value_is_refused_at_build_time():
    parts = paragraphs(outlines.string("documents"))
    with pytest.raises(outlines.GraphBuildError, match="ragged"):
        parts[0]
