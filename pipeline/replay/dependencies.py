"""Check D (data dependency): explicit references to earlier outputs, and grounded values.

Explicit references take two forms:
- a binding object recorded by an agent framework: an argument value `{"$ref": "step2.id"}`;
- an unresolved placeholder left in a string: `$step2.id`, `{{step2.id}}`, `{{flight.id}}`, `<booking_id>`.
A reference names a step (`stepN`, 1-based depth among calls), a logged `call_id`, or else a field name that
is looked up in the outputs of earlier successful calls, most recent first. The rest is a path of keys and
list indices. A reference resolves only into the output of an earlier *successful* call.

Grounded parameters (declared by the spec) must carry a value that occurs in the information available
before the step: the outputs of earlier successful calls, the user/system messages so far, or what the
environment declares the agent may know besides the conversation (`Environment.knowledge`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import orjson

from pipeline.core.values import ATOMS

_STEP = re.compile(r"step(\d+)$")
# `$step2.id` (step references only: a bare `$` is too common in money amounts), `{{ path }}`, `<name>`.
_WORD = re.compile(r"[\w-]+")  # a run of the characters that `History.knows` counts as part of a word
_CACHED_TEXT = 4096  # characters of the longest text whose words are cached
# Texts of at most this many characters in all are searched whole: cheaper than finding their words first.
_SCANNED_CHARS = 16_384
# Entries of a history's word index (a word of a split text, a text in a word's postings, a value found) by
# default; a guard session sets its own from its budget. Past it the index stops growing: a text not split is
# searched directly, and a word's postings are not kept, so every answer stays the same and only costs more.
INDEX_ENTRIES = 262_144
INDEX_ENTRY_BYTES = 128  # memory of an entry, at most (measured: 117 bytes a word, 69 a posting)
# The longest text split into words (a text's words are a list for a moment: one long text must not be a peak).
_SPLIT_CHARS = 65_536
_KNOWN_CHARS = 256  # the longest value remembered as found
_PLACEHOLDER = re.compile(r"\$(step\d+(?:\.[\w-]+|\[-?\d+\])*)|\{\{\s*([\w.\[\]-]+)\s*\}\}|^<([A-Za-z_][\w.]*)>$")


class Unresolved(Exception):
    """A reference that does not resolve; the message says why."""


@dataclass
class History:
    """What the agent could know before the current step, indexed so that a look-up does not rescan earlier texts
    (docs/explanation/architecture.md, "The guard"): a text keeps the set of its words (once split), and a word asked
    about keeps the texts that hold it, brought up to date when it is asked about again (each text is tested once per
    word); every field name points to the latest output that has it."""

    outputs: dict[int, Any] = field(default_factory=dict)  # step -> output of a successful call
    failed: set[int] = field(default_factory=set)
    call_ids: dict[str, int] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)  # user/system messages, and outputs as JSON text
    # the words (maximal runs of [\w-]) of texts[:n]; None: not split yet (`_holding` says when a text is split)
    vocabulary: list[frozenset[str] | None] = field(default_factory=list)
    # a word asked about -> (the texts that hold it, how many texts have been tested for it)
    postings: dict[str, tuple[set[int], int]] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)  # values found so far (texts only grow: they stay found)
    fields: dict[str, int] = field(default_factory=dict)  # a top-level output key -> the latest step with it
    chars: int = 0  # characters of texts
    index_budget: int = INDEX_ENTRIES  # entries the index (vocabulary, postings, known) may hold
    indexed: int = 0  # entries it holds

    def add_message(self, text: str) -> None:
        if text:
            self._add_text(text)

    def add_known(self, value: Any) -> None:
        """A grounding source the environment declares (not an output: nothing refers to it by step or field)."""
        if value is not None:
            self._add_text(value if isinstance(value, str) else orjson.dumps(value).decode())

    def add_result(self, step: int, call_id: str | None, valid: bool, output: Any) -> None:
        if call_id:
            self.call_ids[call_id] = step
        if not valid:
            self.failed.add(step)
            return
        output = _maybe_json(output)
        self.outputs[step] = output
        if isinstance(output, dict):
            self.fields.update(dict.fromkeys(output, step))
        if output is not None:
            text = output if isinstance(output, str) else orjson.dumps(output).decode()
            self.texts.append(text)  # `_add_text`, inline
            self.chars += len(text)

    def _add_text(self, text: str) -> None:
        self.texts.append(text)  # its words are found when a value is first looked up after it (often never)
        self.chars += len(text)

    def knows(self, value: Any) -> bool:
        """Whether a grounded value occurs in the available information: as a whole JSON value or key of an
        earlier output, or as a whole word (not part of a longer id) in a message or an output's text."""
        text = _scalar_text(value)
        if text is None:
            return True  # containers are checked element by element by the caller
        if not text:
            return False
        if text in self.known:
            return True
        if self._finds(text):
            if len(text) <= _KNOWN_CHARS and self.indexed < self.index_budget:
                self.known.add(text)
                self.indexed += 1
            return True
        return False

    def _finds(self, text: str) -> bool:
        quoted = orjson.dumps(text).decode()
        if self.chars <= _SCANNED_CHARS:  # a short history: every text, as `_candidates` would narrow them
            texts = self.texts
            for t in texts:  # a loop, not any() over a generator: this runs for most grounded values
                if quoted in t:
                    return True
            return any(_whole_word(text, t) for t in texts)
        candidates = self._candidates(text)
        # Escapes (`\n`, `\u0001`) change the runs of word characters: then the quoted form has its own.
        quoted_in = candidates if len(quoted) == len(text) + 2 else self._candidates(quoted)
        if any(quoted in self.texts[i] for i in quoted_in):  # the fast, common case
            return True
        return any(_whole_word(text, self.texts[i]) for i in candidates)

    def _candidates(self, text: str) -> Iterable[int]:
        """The texts that may hold `text` where both searches of `knows` look for it. Each of its runs of word
        characters is bounded there by its own other characters or the searches' boundaries, so it is a
        whole word of any text that holds it: only texts that have every one of them can match."""
        runs = _words(text)
        if len(runs) <= 1:  # most values: one id, one word
            return self._holding(next(iter(runs))) if runs else range(len(self.texts))
        return set.intersection(*sorted(map(self._holding, runs), key=len))

    def _holding(self, run: str) -> set[int]:
        """The texts that have `run` as a word, testing only the texts added since it was last asked about. A
        word of a text is a part of it, so a text is split into words only once a run asked about is part of
        it: a long output or configuration that holds none of the runs asked about is never split."""
        held, tested = self.postings.get(run) or (set(), 0)
        texts, vocabulary = self.texts, self.vocabulary
        if tested < len(texts):
            posted = len(held) + 1 if tested else 0  # entries the word's postings count now (none: not kept)
            vocabulary.extend([None] * (len(texts) - len(vocabulary)))
            for i in range(tested, len(texts)):
                words = vocabulary[i]
                if words is None:
                    if run not in texts[i]:
                        continue
                    size = len(texts[i])
                    if size > _SPLIT_CHARS or self.indexed + size // 2 + 1 > self.index_budget:
                        held.add(i)  # not split (too long, or the index is full): it may hold the word
                        continue
                    words = vocabulary[i] = _words(texts[i])
                    self.indexed += len(words)
                if run in words:
                    held.add(i)
            if self.indexed - posted + len(held) + 1 <= self.index_budget:
                self.postings[run] = (held, len(texts))
                self.indexed += len(held) + 1 - posted
            elif posted:  # the index is full: the word's postings are dropped, found again when asked
                del self.postings[run]
                self.indexed -= posted
        return held

    def resolve(self, ref: str, step: int) -> Any:
        head, *path = _split(ref)
        match = _STEP.match(head)
        if match or head in self.call_ids:
            source = int(match.group(1)) if match else self.call_ids[head]
            if source >= step:
                raise Unresolved(f"{ref}: step {source} is not before step {step}")
            if source in self.failed:
                raise Unresolved(f"{ref}: step {source} failed")
            if source not in self.outputs:
                raise Unresolved(f"{ref}: no step {source}")
            return _walk(self.outputs[source], path, ref)
        if head in self.fields:
            return _walk(self.outputs[self.fields[head]][head], path, ref)
        raise Unresolved(f"{ref}: no earlier successful output has a field {head!r}")


def resolve_references(args: Any, history: History, step: int) -> tuple[Any, dict[str, str], set[str]]:
    """Substitute resolvable references in `args`.

    Returns (new args, {top-level argument: reason} for references that failed, top-level arguments that
    held a reference). Failed references are left as they were.
    """
    failures: dict[str, str] = {}
    holders: set[str] = set()
    if not isinstance(args, dict):
        return args, failures, holders
    out = {}
    for key, value in args.items():
        if type(value) in ATOMS and not (type(value) is str and _may_refer(value)):
            out[key] = value  # what `_substitute` returns for a value without a reference, without the call
            continue
        new, errors, found = _substitute(value, history, step)
        out[key] = new
        if found:
            holders.add(key)
        if errors:
            failures[key] = errors[0]
    return out, failures, holders


def no_references(text: str) -> bool:
    """Whether the values decoded from the JSON text `text` can hold no reference, told from the text alone: every
    form of one has a `$` (`$step`, `$ref`), `{{` or `<` that a JSON text shows as is, or escaped (`\\u`)."""
    return "$" not in text and "{{" not in text and "<" not in text and "\\u" not in text


def _substitute(value: Any, history: History, step: int) -> tuple[Any, list[str], bool]:
    if isinstance(value, str):
        return _substitute_text(value, history, step)
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get("$ref"), str):
            try:
                return history.resolve(value["$ref"], step), [], True
            except Unresolved as exc:
                return value, [str(exc)], True
        errors: list[str] = []
        found = False
        out = {}
        for k, v in value.items():
            out[k], e, f = _substitute(v, history, step)
            errors += e
            found |= f
        return out, errors, found
    if isinstance(value, list):
        errors, found, items = [], False, []
        for v in value:
            new, e, f = _substitute(v, history, step)
            items.append(new)
            errors += e
            found |= f
        return items, errors, found
    return value, [], False


def _may_refer(text: str) -> bool:
    return "$step" in text or "{{" in text or text.startswith("<")


def _substitute_text(text: str, history: History, step: int) -> tuple[Any, list[str], bool]:
    if not _may_refer(text):
        return text, [], False  # the common case, without a regex
    matches = list(_PLACEHOLDER.finditer(text))
    if not matches:
        return text, [], False
    errors: list[str] = []
    resolved: list[Any] = []
    for m in matches:
        ref = m.group(1) or m.group(2) or m.group(3)
        try:
            resolved.append(history.resolve(ref, step))
        except Unresolved as exc:
            errors.append(str(exc))
    if errors:
        return text, errors, True
    if len(matches) == 1 and matches[0].span() == (0, len(text)):
        return resolved[0], [], True  # the whole value is the reference: keep the referenced type
    pieces, last = [], 0
    for m, value in zip(matches, resolved, strict=True):
        pieces += [text[last : m.start()], str(value)]
        last = m.end()
    return "".join([*pieces, text[last:]]), [], True


def grounded_values(args: object, path: str) -> Iterator[Any]:
    """The values at a grounded parameter path (`order_id`, `items[].item_id`, `payment.card_id`) in a call's
    arguments: none unless they are an object."""
    if "." not in path and not path.endswith("[]"):  # a top-level argument, the common case: as below, shorter
        value = args.get(path) if isinstance(args, dict) else None
        if isinstance(value, list):
            yield from value
        elif value is not None:
            yield value
        return
    values: list[Any] = [args]
    for part in path.split("."):
        many = part.endswith("[]")
        key = part.removesuffix("[]")
        nxt: list[Any] = []
        for v in values:
            if isinstance(v, dict) and key in v:
                item = v[key]
                if many and isinstance(item, list):
                    nxt.extend(item)
                else:
                    nxt.append(item)
        values = nxt
    for v in values:
        if isinstance(v, list):
            yield from v
        elif v is not None:
            yield v


def _whole_word(word: str, text: str) -> bool:
    r"""Whether `word` occurs in `text` as the regular expression `(?<![\w.\-])WORD(?![\w\-]|\.\w)` finds it,
    without compiling one per value (`\w`: `str.isalnum` or `_`, as `re` has it)."""
    end, i = len(text), text.find(word)
    while i >= 0:
        j = i + len(word)
        before = i == 0 or (not _continues(text[i - 1]) and text[i - 1] != ".")
        after = j == end or (not _continues(text[j]) and not (text[j] == "." and _continues(text[j + 1 : j + 2], "_")))
        if before and after:
            return True
        i = text.find(word, i + 1)
    return False


def _continues(char: str, joiners: str = "_-") -> bool:
    """Whether `char` continues a word: a word character, or `-` (where a word may not be followed or preceded
    by one)."""
    return char.isalnum() or (char != "" and char in joiners)


@lru_cache(maxsize=1024)
def _cached_words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text))


def _words(text: str) -> frozenset[str]:
    """The words of `text`. Outputs repeat across rollouts (a product list, a user record): short texts are
    cached, so that a worker finds each one's words once; the cache's size is bounded (1,024 texts of at
    most 4 KiB)."""
    return _cached_words(text) if len(text) <= _CACHED_TEXT else frozenset(_WORD.findall(text))


def _split(ref: str) -> list[str]:
    return [p for p in re.split(r"\.|\[|\]", ref.strip()) if p]


def _walk(value: Any, path: list[str], ref: str) -> Any:
    for key in path:
        value = _maybe_json(value)
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.lstrip("-").isdigit() and -len(value) <= int(key) < len(value):
            value = value[int(key)]
        else:
            raise Unresolved(f"{ref}: no field {key!r}")
    return value


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _scalar_text(value: Any) -> str | None:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        return value
    return None
