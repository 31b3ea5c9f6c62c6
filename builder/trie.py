"""Tool trie of a catalog: its tokenized paths -> ``toolcall.runtime.grammar.trie.Grammar`` (the trie itself is
built by runtime/grammar/build.py, which the runtime also runs on a request's own tools)."""
from __future__ import annotations

import tokenizers

from toolcall.builder.catalog import Catalog, TokenizedCatalog, tokenize_catalog
from toolcall.runtime.grammar.build import trie_grammar
from toolcall.runtime.grammar.trie import Grammar


def build_grammar(catalog: Catalog, tokenizer: tokenizers.Tokenizer, end_token_id: int) -> Grammar:
    """Tokenize the catalog's tool names (checking them) and build its grammar."""
    return grammar_from_paths(tokenize_catalog(catalog, tokenizer, end_token_id))


def grammar_from_paths(tokenized: TokenizedCatalog) -> Grammar:
    """Build the grammar of already tokenized (and checked) tool paths."""
    catalog = tokenized.catalog
    return trie_grammar(catalog.names, tokenized.paths, sep_token_id=tokenized.sep_token_id,
                        end_token_id=tokenized.end_token_id, max_tools=catalog.answer.max_tools,
                        allow_empty=catalog.answer.allow_empty, separator=catalog.answer.separator,
                        prompt_template=catalog.prompt_template)
