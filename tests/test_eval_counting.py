"""models/recipe/eval.py's counting and its independent grammar trie, on hand-made cases."""
from __future__ import annotations

import pytest

import toolcall.models.recipe.eval as ev

SEP, END = 10, 2


def test_score_on_hand_made_lists():
    labels = [["a", "b"], ["c"], ["a", "d", "e"], ["b"]]
    pred = [["b", "a"], ["c"], ["a", "d"], ["c", "b"]]
    s = ev.score(pred, labels)
    assert s["n"] == 4
    assert s["exact_set"] == 2  # rows 0 and 1
    assert s["exact_list"] == 1  # row 1 only: row 0 has the right set in the wrong order
    assert s["order_agreement"] == pytest.approx(1 / 2)
    assert s["tool_hits"] == 2 + 1 + 2 + 1 and s["labelled_tools"] == 7 and s["predicted_tools"] == 7
    assert s["recall"] == pytest.approx(6 / 7) and s["precision"] == pytest.approx(6 / 7)
    assert s["exact_set_rate"] == pytest.approx(0.5) and s["exact_list_rate"] == pytest.approx(0.25)


def test_score_counts_an_empty_answer_as_all_missed():
    s = ev.score([[], ["x", "y"]], [["x"], ["x"]])
    assert (s["exact_set"], s["tool_hits"], s["predicted_tools"], s["labelled_tools"]) == (0, 1, 2, 2)
    assert s["recall"] == pytest.approx(0.5) and s["precision"] == pytest.approx(0.5)
    assert ev.score([[]], [["x"]])["precision"] == 0.0  # no predicted tools: 0, not a division error
    assert ev.score([], [])["exact_set_rate"] == 0.0


def test_by_template_counts_each_template_once_per_request_worst_first():
    patterns = [("p", "q"), ("q",), ("p", "p"), ("r",)]
    labels = [["a", "b"], ["b"], ["a", "c"], ["d"]]
    pred = [["b", "a"], ["c"], ["a"], ["d"]]  # right, wrong, wrong, right
    rows = ev.by_template(patterns, pred, labels)
    assert rows == [{"pattern": "p", "requests": 2, "exact_set": 1}, {"pattern": "q", "requests": 2, "exact_set": 1},
                    {"pattern": "r", "requests": 1, "exact_set": 1}]


def test_identical_needs_same_tools_in_same_order():
    a = [["x", "y"], ["x"], [], ["z"]]
    b = [["x", "y"], ["y"], [], ["z", "x"]]
    assert ev.identical(a, b) == 2
    assert ev.identical(a, a) == 4


@pytest.fixture
def trie():
    # "ab" = [5, 6] is a token-prefix of "abc" = [5, 6, 7]; "d" = [8]; at most 2 tools per answer.
    return ev.ToolTrie(["ab", "abc", "d"], [[5, 6], [5, 6, 7], [8]], SEP, END, max_tools=2)


def test_trie_allows_names_then_sep_or_end(trie):
    assert trie.allowed([]) == [5, 8]
    assert trie.allowed([5]) == [6]
    assert trie.allowed([5, 6]) == [END, 7, SEP]  # "ab" may end here or continue to "abc"
    assert trie.allowed([5, 6, 7]) == [END, SEP]
    assert trie.allowed([5, 6, SEP]) == [5, 8]  # "abc" still unused below token 5
    assert trie.allowed([5, 6, SEP, 5, 6]) == [7]  # "ab" used: only its extension; and 2 tools reached ...
    assert trie.allowed([5, 6, SEP, 5, 6, 7]) == [END]  # ... so no SEP after the second tool
    assert trie.allowed([8, END]) == []


def test_trie_used_set_blocks_a_subtree_once_all_its_tools_are_named():
    both = ev.ToolTrie(["ab", "abc", "d"], [[5, 6], [5, 6, 7], [8]], SEP, END, max_tools=3)
    assert both.allowed([5, 6, SEP, 5, 6, 7, SEP]) == [8]


def test_trie_refuses_tokens_outside_the_grammar(trie):
    for bad in ([6], [5, 6, 7, 7], [8, SEP, 8], [8, END, 8], [SEP]):
        with pytest.raises(ValueError, match="outside the grammar"):
            trie.state(bad)


def test_trie_decodes_closed_names_only(trie):
    assert trie.decode([5, 6, SEP, 8, END]) == ["ab", "d"]
    assert trie.decode([5, 6, 7, END, 0, 0]) == ["abc"]
    assert trie.decode([8, SEP, 5]) == ["d"]  # a name still open at the length limit is dropped
    assert trie.max_answer_tokens == (3 + 1) + (2 + 1)


def test_trie_with_allow_empty_takes_end_at_the_root_only():
    trie = ev.ToolTrie(["ab", "abc", "d"], [[5, 6], [5, 6, 7], [8]], SEP, END, max_tools=2, allow_empty=True)
    assert trie.allowed([]) == [END, 5, 8]
    assert trie.allowed([END]) == [] and trie.decode([END, END]) == []
    assert trie.allowed([8, SEP]) == [5]  # after a tool, END only closes a name
    with pytest.raises(ValueError, match="outside the grammar"):
        ev.ToolTrie(["d"], [[8]], SEP, END, max_tools=2).state([END])


def test_empty_scores_count_none_requests_and_tool_requests_answered_empty():
    labels = [[], [], ["a"], ["a", "b"], [], ["c"]]
    pred = [[], ["a"], [], ["a", "b"], [], ["c"]]
    s = ev.empty_scores(pred, labels)
    assert (s["no_tool_requests"], s["none_answered_empty"], s["tool_requests"], s["tool_requests_answered_empty"]) \
        == (3, 2, 3, 1)
    assert s["none_accuracy"] == pytest.approx(2 / 3) and s["tool_requests_empty"] == pytest.approx(1 / 3)
    assert ev.score(pred, labels)["exact_set"] == 4  # an empty answer to a no-tool request is an exact set


def test_handwritten_set_is_large_enough_and_names_catalog_tools(tmp_path):
    from toolcall.builder.catalog import load_catalog
    from toolcall.common.errors import CatalogError
    from toolcall.models.recipe.handwritten import load_handwritten

    names = set(load_catalog("builder/data/tools-64.json").names)
    items = load_handwritten(tool_names=names)
    assert len(items) >= 200 and sum(not t for _, t in items) >= 40
    assert {t for _, tools in items for t in tools} == names  # every tool is asked for at least once
    issue = {"Call my mom": ("make_phone_call",), "What's 17 times 23?": ("calculate",),
             "Text Jonas that I'm running late": ("send_text_message",), "hello": (), "": ()}
    assert set(issue.items()) <= set(items)
    bad = tmp_path / "bad.tsv"
    for text in ("hello\n", "call mom\tmake_a_call\n", "call mom\tmake_phone_call,make_phone_call\n"):
        bad.write_text(text)
        with pytest.raises(CatalogError, match="bad.tsv:1"):
            load_handwritten(bad, names)


def test_variation_changes_numbers_names_and_punctuation_only():
    from toolcall.models.recipe.variation import vary

    text = "Send 40 bucks to Marta for 'Lunch at Noon' on Friday"
    out = vary(text, seed=0)
    assert out == vary(text, seed=0) and out != vary(text, seed=1)
    words = out.rstrip(".!?").split(" ")
    assert words[0] == "send" and words[1].isdigit() and len(words[1]) == 2 and words[4] != "Marta"
    assert "'Lunch at Noon'" in out and words[-1] == "Friday"  # quoted text and weekdays stay
    assert vary("hello?", 0) == "Hello" and vary("", 0) == "" and vary("ok", 0)[-1] in ".!?"
