"""Prompt encoding, defined once: the stored template split at ``{request}``, each part tokenized apart.

A bundle's (rendered) template is ``prefix + "{request}" + suffix``. The model input of a
request is the concatenation of three token sequences, each encoded on its own with
``add_special_tokens=False`` (the template says explicitly which special tokens it holds):

- prefix: the template's text before ``{request}``, special-token strings parsed as special
  tokens. It is the same for every request, so it is computed once at load and its KV pages
  are shared (runtime/batching/prefix_cache.py).
- request: the caller's text as plain text, by a copy of the tokenizer that matches no added
  token (special or not) and has ``encode_special_tokens`` set: special-token strings inside it
  are split into ordinary tokens, so a request cannot inject ``<|im_end|>``, ``<|im_start|>``
  or ``<think>``.
- suffix: the template's text after ``{request}``, special tokens parsed like the prefix.

Tokenizing the parts apart means no BPE merge crosses a boundary: the prefix's ids never
depend on the request. ``TOKENIZATION`` names this scheme in the contract's ``prompt`` section.

A request that brings its own tools (runtime/grammar/request_tools.py) gets the encoder of the template
rendered with them (``with_template``), exactly as a catalog of those tools would: the same tools give the same
prompt ids either way. Their text comes from the caller, so a tool text that would add a special token is
refused there.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from tokenizers import Tokenizer

from toolcall.common.errors import Refusal, RequestError

REQUEST_PLACEHOLDER = "{request}"
TOKENIZATION = "parts-apart/v1"  # prefix, request (plain text), suffix: each encoded alone, ids concatenated


def split_template(template: str) -> tuple[str, str]:
    """(prefix, suffix) of a template holding ``{request}`` exactly once; Refusal("bundle_invalid")
    otherwise (the builder refuses such a catalog, so a bundle holding one was altered)."""
    found = template.count(REQUEST_PLACEHOLDER)
    if found != 1:
        raise Refusal("bundle_invalid", f"the bundle's prompt template holds {REQUEST_PLACEHOLDER} {found} times, "
                      "expected exactly once; rebuild the bundle", placeholder=REQUEST_PLACEHOLDER, found=found)
    prefix, suffix = template.split(REQUEST_PLACEHOLDER)
    return prefix, suffix


def check_request_text(text: object) -> str:
    """The request text, or RequestError("request_invalid") for text that is not a non-blank,
    well-formed string (bytes must be UTF-8; lone surrogates are refused)."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise RequestError("request_invalid", f"the request is not valid UTF-8 (byte {e.start}: {e.reason}); "
                               "send UTF-8 text", position=e.start) from None
    if not isinstance(text, str):
        raise RequestError("request_invalid", f"the request must be text, found {type(text).__name__}",
                           found=type(text).__name__)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates (e.g. "\\ud800" in JSON, or argv's undecodable bytes)
        raise RequestError("request_invalid", f"the request holds a lone surrogate or undecodable byte at "
                           f"character {e.start}; send well-formed UTF-8 text", position=e.start) from None
    if not text.strip():
        raise RequestError("request_invalid", "the request is empty or whitespace only; send the text of a "
                           "request", length=len(text))
    return text


def _without_added_tokens(doc: dict) -> dict:
    """A tokenizer.json document that matches no added token (special like ``<|im_end|>`` or not, like
    Qwen3's ``<think>``): request text is then split by the model (BPE) alone, as plain text."""
    return {**doc, "added_tokens": []}


@dataclass(frozen=True)
class PromptEncoder:
    """Turns request text into prompt ids: fixed prefix ids + request ids (plain text) + suffix ids."""

    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    _template_tok: Tokenizer  # special tokens parsed
    _text_tok: Tokenizer  # the same tokenizer with special tokens split (encode_special_tokens)

    @classmethod
    def create(cls, tokenizer: Tokenizer, template: str) -> "PromptEncoder":
        """The encoder of ``template`` (holding ``{request}`` once) with ``tokenizer`` (not modified)."""
        prefix, suffix = split_template(template)
        try:
            text_tok = Tokenizer.from_str(json.dumps(_without_added_tokens(json.loads(tokenizer.to_str()))))
        except Exception as e:  # a tokenizer that loads but cannot be rebuilt without its added tokens
            raise Refusal("bundle_invalid", f"the tokenizer cannot be copied for plain-text requests: "
                          f"{type(e).__name__}: {e}", reason=type(e).__name__) from None
        text_tok.encode_special_tokens = True  # belt and braces: the copy has no added tokens left to match
        encoder = cls((), (), tokenizer, text_tok)
        return cls(encoder.template_ids(prefix), encoder.template_ids(suffix), tokenizer, text_tok)

    def with_template(self, template: str) -> "PromptEncoder":
        """The encoder of another template (``{request}`` once, special tokens parsed), with this one's tokenizers
        (no tokenizer copied: cheap)."""
        prefix, suffix = split_template(template)
        return PromptEncoder(self.template_ids(prefix), self.template_ids(suffix), self._template_tok, self._text_tok)

    def template_ids(self, text: str) -> tuple[int, ...]:
        """Ids of template text: special-token strings parsed as special tokens."""
        return tuple(self._template_tok.encode(text, add_special_tokens=False).ids) if text else ()

    @property
    def template_tokenizer(self) -> Tokenizer:
        """The bundle's tokenizer as the template reads (special tokens parsed)."""
        return self._template_tok

    @property
    def plain_tokenizer(self) -> Tokenizer:
        """The tokenizer that reads caller text as plain text (matches no added token)."""
        return self._text_tok

    def plain_ids(self, text: str) -> tuple[int, ...]:
        """Ids of caller text as plain text (special-token strings split into ordinary tokens)."""
        return tuple(self._text_tok.encode(text, add_special_tokens=False).ids) if text else ()

    def request_ids(self, text: object) -> tuple[int, ...]:
        """The request's own ids (plain text); RequestError for text check_request_text refuses."""
        return self.plain_ids(check_request_text(text))

    def encode(self, text: object) -> tuple[int, ...]:
        """The whole prompt of a request: prefix + request (plain text) + suffix ids."""
        return self.prefix_ids + self.request_ids(text) + self.suffix_ids
