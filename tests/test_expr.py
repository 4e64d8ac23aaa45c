"""Tests for the safe expression language in pipeline.expr."""

from __future__ import annotations

import ast
import operator
import pickle
import re
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import expr as expr_module
from pipeline.expr import EvalError, Expr, ExprError, Target, compile_expr, compile_target, render
from pipeline.expr import _budget as budget
from pipeline.expr import _runtime as runtime

NAMES = frozenset({"args", "state", "oid"})


def make_ctx() -> dict[str, Any]:
    return {
        "args": {
            "order_id": "O1",
            "item_ids": ["a", "b"],
            "amount": 8,
            "items": [{"qty": 1, "sku": "x"}, {"qty": 0, "sku": "y"}, {"qty": 3, "sku": "z"}],
            "name": "Alice",
            "missing_id": "O999",
        },
        "state": {
            "orders": {
                "O1": {
                    "status": "delivered",
                    "items": [{"price": 2.5, "quantity": 2}, {"price": 1, "quantity": 3}],
                },
                "O2": {"status": "pending", "items": []},
            },
            "log": [10, 20, 30],
        },
        "oid": "O2",
    }


@pytest.fixture
def ctx() -> dict[str, Any]:
    return make_ctx()


def ev(source: str, ctx: dict[str, Any] | None = None) -> Any:
    return compile_expr(source, NAMES)(make_ctx() if ctx is None else ctx)


# ---- evaluation ----


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("args.order_id in state.orders", True),
        ("args.missing_id in state.orders", False),
        ("state.orders[args.order_id].status == 'delivered' and len(args.item_ids) > 0", True),
        ("sum(i.price * i.quantity for i in state.orders[args.order_id].items) >= args.amount", True),
        ("sum(i.price * i.quantity for i in state.orders[args.order_id].items)", 8.0),
        (
            "{'order_id': oid, 'status': 'pending', 'items': [x for x in args.items if x.qty > 0]}",
            {
                "order_id": "O2",
                "status": "pending",
                "items": [{"qty": 1, "sku": "x"}, {"qty": 3, "sku": "z"}],
            },
        ),
    ],
)
def test_examples_from_spec(source: str, expected: Any) -> None:
    assert ev(source) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # arithmetic
        ("1 + 2", 3),
        ("'ab' + 'cd'", "abcd"),
        ("[1] + [2, 3]", [1, 2, 3]),
        ("7 - 10", -3),
        ("6 * 7", 42),
        ("2.5 * 2", 5.0),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("7 % 3", 1),
        ("-7 % 3", 2),
        ("-args.amount", -8),
        ("+args.amount", 8),
        ("- -3", 3),
        ("1 + 2 * 3 - 4 / 2", 5.0),
        # comparisons
        ("1 == 1", True),
        ("1 == 2", False),
        ("1 != 2", True),
        ("'a' != 'a'", False),
        ("1 < 2", True),
        ("2 < 1", False),
        ("2 <= 2", True),
        ("3 <= 2", False),
        ("3 > 2", True),
        ("2 > 3", False),
        ("2 >= 2", True),
        ("1 >= 2", False),
        ("'abc' < 'abd'", True),
        ("[1, 2] == [1, 2]", True),
        ("'a' in ['a', 'b']", True),
        ("'c' in ['a', 'b']", False),
        ("'c' not in ['a', 'b']", True),
        ("'ell' in 'hello'", True),
        ("'O1' in state.orders", True),
        ("'O3' not in state.orders", True),
        ("1 < 2 < 3", True),
        ("1 < 3 < 2", False),
        ("1 < 2 <= 2 != 3 > 0", True),
        ("args.amount is not None", True),
        ("get(args, 'nope') is None", True),
        ("(1 == 1) is True", True),
        # boolean logic: Python truthiness and operand values
        ("true and false", False),
        ("True and True", True),
        ("1 and 'x'", "x"),
        ("0 and 'x'", 0),
        ("'' or 'default'", "default"),
        ("'v' or 'default'", "v"),
        ("false or false", False),
        ("null or 0 or [] or 'last'", "last"),
        ("1 and 2 and 3", 3),
        ("1 and 0 and 3", 0),
        ("not true", False),
        ("not []", True),
        ("not 'x'", False),
        ("not 1 == 2", True),
        # conditional
        ("'yes' if args.amount > 5 else 'no'", "yes"),
        ("'yes' if args.amount > 50 else 'no'", "no"),
        # literals and aliases
        ("null", None),
        ("None", None),
        ("true", True),
        ("false", False),
        ("1.5", 1.5),
        ("'s'", "s"),
        ("[1, 'a', null]", [1, "a", None]),
        ("(1, 2)", [1, 2]),
        ("()", []),
        ("{}", {}),
        ("{'a': 1, args.order_id: 2}", {"a": 1, "O1": 2}),
        ("{oid: [x.sku for x in args.items]}", {"O2": ["x", "y", "z"]}),
        # lookups, indexes, slices
        ("state.orders.O1.status", "delivered"),
        ("state['orders'][oid]['status']", "pending"),
        ("state.log[0]", 10),
        ("state.log[-1]", 30),
        ("state.log[1 + 1]", 30),
        ("state.log[1:]", [20, 30]),
        ("state.log[:-1]", [10, 20]),
        ("state.log[::2]", [10, 30]),
        ("state.log[::-1]", [30, 20, 10]),
        ("args.name[1:3]", "li"),
        ("args.items[2].sku", "z"),
        # comprehensions
        ("[x * 2 for x in state.log]", [20, 40, 60]),
        ("[x for x in state.log if x > 10 if x < 30]", [20]),
        ("[[a, b] for a in [1, 2] for b in [3, 4] if a + b != 5]", [[1, 3], [2, 4]]),
        ("[[a, b] for a in [1, 2] for b in [a, a + 10]]", [[1, 1], [1, 11], [2, 2], [2, 12]]),
        ("[k for k in state.orders]", ["O1", "O2"]),
        ("[k for k, v in items(state.orders) if v.status == 'pending']", ["O2"]),
        ("{k: v.status for k, v in items(state.orders)}", {"O1": "delivered", "O2": "pending"}),
        ("{x.sku: x.qty for x in args.items if x.qty}", {"x": 1, "z": 3}),
        ("(x.qty for x in args.items)", [1, 0, 3]),
        ("len(x for x in state.log if x > 10)", 2),
        ("[[y for y in x] for x in ['ab', 'c']]", [["a", "b"], ["c"]]),
        ("[args for args in [1, 2]]", [1, 2]),
        ("[oid for oid in state.log if oid > 15] + [oid]", [20, 30, "O2"]),
    ],
)
def test_operators_and_literals(source: str, expected: Any) -> None:
    result = ev(source)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("false and state.nope", False),
        ("true or state.nope", True),
        ("'a' if true else state.nope", "a"),
        ("state.nope if false else 'a'", "a"),
        ("any(1 / x > 0 for x in [1, 0])", True),
        ("not all(1 / x > 5 for x in [1, 0])", True),
        ("1 > 2 > state.nope", False),
        ("0 and 1 and state.nope", 0),
        ("1 or 2 or state.nope", 1),
    ],
)
def test_short_circuit_skips_failing_parts(source: str, expected: Any) -> None:
    result = ev(source)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("len(args.item_ids)", 2),
        ("len('abc')", 3),
        ("len(state.orders)", 2),
        ("str(5)", "5"),
        ("str(null)", "None"),
        ("int('42')", 42),
        ("int(3.9)", 3),
        ("float('1.5')", 1.5),
        ("float(2)", 2.0),
        ("bool(0)", False),
        ("bool('x')", True),
        ("abs(-3)", 3),
        ("abs(-2.5)", 2.5),
        ("min(state.log)", 10),
        ("min(3, 1, 2)", 1),
        ("max(state.log)", 30),
        ("max(x.qty for x in args.items)", 3),
        ("max(3, 9)", 9),
        ("sum(state.log)", 60),
        ("sum([1, 2], 10)", 13),
        ("sum([])", 0),
        ("round(2.567)", 3),
        ("round(2.567, 2)", 2.57),
        ("any([0, '', 1])", True),
        ("any([])", False),
        ("all([1, 'x'])", True),
        ("all([1, 0])", False),
        ("all(x.qty >= 0 for x in args.items)", True),
        ("sorted([3, 1, 2])", [1, 2, 3]),
        ("sorted([3, 1, 2], reverse=true)", [3, 2, 1]),
        ("sorted(state.orders, reverse=True)", ["O2", "O1"]),
        ("sorted(x.sku for x in args.items if x.qty)", ["x", "z"]),
        ("keys(state.orders)", ["O1", "O2"]),
        ("values({'a': 1, 'b': 2})", [1, 2]),
        ("items({'a': 1, 'b': 2})", [["a", 1], ["b", 2]]),
        ("get(state.orders, 'O9')", None),
        ("get(state.orders, 'O9', 'none')", "none"),
        ("get(state.orders, 'O9', default=0)", 0),
        ("get(state.orders.O2, 'status')", "pending"),
        ("get(state.log, 1)", 20),
        ("get(state.log, -1)", 30),
        ("get(state.log, 3, 'out')", "out"),
        ("get(state.log, 'a', 'out')", "out"),
        ("get(null, 'x', 7)", 7),
        ("has(state.orders, 'O1')", True),
        ("has(state.orders, 'O3')", False),
        ("has(state.log, 2)", True),
        ("has(state.log, -3)", True),
        ("has(state.log, 3)", False),
        ("has(null, 'x')", False),
        ("lower('AbC')", "abc"),
        ("upper('AbC')", "ABC"),
        ("startswith(args.order_id, 'O')", True),
        ("startswith(args.order_id, 'X')", False),
        ("endswith('file.txt', '.txt')", True),
        ("endswith('file.txt', '.csv')", False),
        ("contains(args.item_ids, 'b')", True),
        ("contains(args.item_ids, 'c')", False),
        ("contains('hello', 'ell')", True),
        ("contains(state.orders, 'O2')", True),
        ("concat([1], [2, 3])", [1, 2, 3]),
        ("concat([], [])", []),
        ("unique([3, 1, 3, 2, 1])", [3, 1, 2]),
        ("unique([{'a': 1}, {'a': 1}, [1], [1], 'x'])", [{"a": 1}, [1], "x"]),
        ("count([1, 2, 1, 1], 1)", 3),
        ("count(args.item_ids, 'z')", 0),
        ("matches(args.order_id, 'O[0-9]+')", True),
        ("matches('O12x', 'O[0-9]+')", False),
        ("matches('xO12', 'O[0-9]+')", False),
    ],
)
def test_functions(source: str, expected: Any) -> None:
    result = ev(source)
    assert result == expected
    assert type(result) is type(expected)


def test_literals_are_fresh_each_evaluation() -> None:
    e = compile_expr("{'items': []}", NAMES)
    first, second = e({}), e({})
    assert first == second == {"items": []}
    first["items"].append(1)
    assert e({}) == {"items": []}
    assert first["items"] is not second["items"]


# ---- runtime errors ----


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("state.orders['O999']", "no key 'O999' in state.orders"),
        ("state.orders[args.missing_id]", "no key 'O999' in state.orders"),
        ("state.orders[args.missing_id].status", "no key 'O999' in state.orders"),
        ("state.orders.O999", "no key 'O999' in state.orders"),
        ("state.orders.O1.color", "no key 'color' in state.orders.O1"),
        ("[x.price for x in args.items]", "no key 'price' in x"),
        ("state.log[3]", "index 3 out of range for state.log (length 3)"),
        ("state.log[-4]", "index -4 out of range for state.log (length 3)"),
        ("state.log.first", "cannot look up 'first' in state.log: it is list"),
        ("args.order_id.x", "cannot look up 'x' in args.order_id: it is str"),
        ("args.amount[0]", "cannot look up 0 in args.amount: it is int"),
        ("get(args, 'nope').x", "cannot look up 'x' in get(args, 'nope'): it is null"),
        ("state.log['a']", "cannot look up 'a' in state.log: it is list"),
        ("args.amount[1:]", "cannot slice args.amount: it is int"),
    ],
)
def test_missing_keys_raise_eval_error_naming_the_key(source: str, message: str) -> None:
    with pytest.raises(EvalError) as info:
        ev(source)
    assert str(info.value) == message


def test_name_missing_from_context() -> None:
    e = compile_expr("args.x", NAMES)
    with pytest.raises(EvalError, match="name 'args' is not set"):
        e({"state": {}})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("'a' < 1", "cannot compare str and int"),
        ("null < 1", "cannot compare null and int"),
        ("1 < 2 < 'x'", "cannot compare int and str"),
        ("1 in 5", "cannot compare int and int"),
        ("[1] in {}", "cannot compare list and object"),
        ("1 + 'x'", "cannot apply '+' to int and str"),
        ("{} + {}", "cannot apply '+' to object and object"),
        ("'a' - 'b'", "cannot apply '-' to str and str"),
        ("'a' * 3", "cannot apply '*' to str and int"),
        ("[0] * 3", "cannot apply '*' to list and int"),
        ("'%s' % 1", "cannot apply '%' to str and int"),
        ("'a' / 2", "cannot apply '/' to str and int"),
        ("1 / 0", "division by zero in 1 / 0"),
        ("1 // 0", "division by zero"),
        ("1 % 0", "division by zero"),
        ("1.0 / 0.0", "division by zero"),
        ("-'a'", "cannot apply unary '-' to str"),
        ("+null", "cannot apply unary '+' to null"),
        ("[x for x in 5]", "cannot iterate over 5: it is int"),
        ("[x for x in args.amount]", "cannot iterate over args.amount: it is int"),
        ("[a for a, b in [[1, 2], [3]]]", "cannot unpack list into a, b"),
        ("[a for a, b in [1]]", "cannot unpack int into a, b"),
        ("{[1]: 2}", "unhashable key"),
        ("{x: 1 for x in [[1]]}", "unhashable key"),
        ("state.log['a':]", "bad slice of state.log"),
        ("state.log[::0]", "bad slice of state.log"),
    ],
)
def test_runtime_type_errors(source: str, message: str) -> None:
    with pytest.raises(EvalError, match=re.escape(message)):
        ev(source)


@pytest.mark.parametrize(
    "source",
    [
        "len(1)",
        "len(null)",
        "int('x')",
        "int(null)",
        "float('abc')",
        "abs('a')",
        "min([])",
        "max(1)",
        "sum(['a', 'b'])",
        "sum([1, 'a'])",
        "round('a')",
        "round(1.5, 'x')",
        "any(1)",
        "all(null)",
        "sorted([1, 'a'])",
        "sorted(5)",
        "sorted([{}, {}])",
        "keys([1])",
        "values('s')",
        "items(null)",
        "get(5, 'a')",
        "get('abc', 0)",
        "has('abc', 0)",
        "has(1, 1)",
        "lower(1)",
        "upper(null)",
        "startswith(1, 'a')",
        "startswith('a', 1)",
        "endswith('a', null)",
        "contains(1, 1)",
        "contains('abc', 1)",
        "concat([1], 'a')",
        "concat(null, [1])",
        "unique('abc')",
        "count('aaa', 'a')",
        "matches(5, 'a')",
    ],
)
def test_function_argument_type_errors(source: str) -> None:
    name = source.split("(", 1)[0]
    with pytest.raises(EvalError, match=rf"^{name}\(\): "):
        ev(source)


def test_eval_error_is_not_a_value_error() -> None:
    assert not issubclass(EvalError, ValueError)
    assert issubclass(ExprError, ValueError)


# ---- compile errors ----


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("eval('1')", "unknown function 'eval'"),
        ("exec('x = 1')", "unknown function 'exec'"),
        ("__import__('os')", "unknown function '__import__'"),
        ("__import__", "unknown name '__import__'"),
        ("__builtins__", "unknown name '__builtins__'"),
        ("open", "unknown name 'open'"),
        ("args.__class__", "attribute '__class__' not allowed"),
        ("args.__class__.__mro__", "attribute '__class__' not allowed"),
        ("args.__dict__", "attribute '__dict__' not allowed"),
        ("[x for __x in args.items]", "bad comprehension variable '__x'"),
        ("lambda: 1", "lambda not allowed"),
        ("(lambda x: x)(1)", "only plain function calls"),
        ("2 ** 10", "operator '**' not allowed"),
        ("(x := 1)", "walrus"),
        ("f'{args}'", "f-strings not allowed"),
        ("args.get('x')", "only plain function calls"),
        ("args.order_id.lower()", "only plain function calls"),
        ("'a'.join(['b'])", "only plain function calls"),
        ("len.__call__(args)", "only plain function calls"),
        ("foo", "unknown name 'foo'"),
        ("args.x + foo", "unknown name 'foo'"),
        ("print(1)", "unknown function 'print'"),
        ("range(10)", "unknown function 'range'"),
        ("getattr(args, 'x')", "unknown function 'getattr'"),
        ("{1, 2}", "set literals not allowed"),
        ("{x for x in args.items}", "set comprehensions not allowed"),
        ("[*args.items]", "starred expressions not allowed"),
        ("len(*args.items)", "argument unpacking not allowed"),
        ("{**args}", "'**' unpacking not allowed"),
        ("get(**args)", "argument unpacking not allowed"),
        ("(yield)", "yield not allowed"),
        ("(yield from args)", "yield not allowed"),
        ("await args", "await not allowed"),
        ("[x async for x in args]", "async comprehensions not allowed"),
        ("1 | 2", "operator '|' not allowed"),
        ("1 & 2", "operator '&' not allowed"),
        ("1 ^ 2", "operator '^' not allowed"),
        ("1 << 2", "operator '<<' not allowed"),
        ("1 >> 2", "operator '>>' not allowed"),
        ("args @ args", "operator '@' not allowed"),
        ("~1", "operator '~' not allowed"),
        ("args is args", "'is' / 'is not' only allowed with None, True or False"),
        ("1 is 1", "'is' / 'is not' only allowed"),
        ("b'x'", "bytes literals not allowed"),
        ("1j", "complex literals not allowed"),
        ("...", "ellipsis literals not allowed"),
        ("[x for x.y in args.items]", "comprehension variables must be plain names"),
        ("[x for x in args.items] + [x]", "unknown name 'x'"),
        ("[null for null in [1]]", "bad comprehension variable 'null'"),
        ("len()", "len() takes 1 positional argument(s), got 0"),
        ("len(1, 2)", "len() takes 1 positional argument(s), got 2"),
        ("get(args)", "get() takes 2 to 3 positional argument(s), got 1"),
        ("min()", "min() takes at least 1 positional argument(s), got 0"),
        ("has(args)", "has() takes 2 positional argument(s), got 1"),
        ("sorted(args, key=len)", "sorted() has no keyword argument 'key'"),
        ("get(args, 'a', fallback=1)", "get() has no keyword argument 'fallback'"),
        ("matches(oid, args.pattern)", "matches() needs a string literal pattern"),
        ("matches(oid, '(')", "bad regular expression"),
        ("x = 1", "syntax error"),
        ("1 +", "syntax error"),
        ("args.", "syntax error"),
        ("import os", "syntax error"),
        ("args.x; args.y", "syntax error"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("a\x00b", "null bytes"),
    ],
)
def test_forbidden_constructs_are_compile_errors(source: str, message: str) -> None:
    with pytest.raises(ExprError) as info:
        compile_expr(source, NAMES)
    assert message in str(info.value)
    assert info.value.problem in str(info.value)


def test_compile_error_message_has_source_and_column() -> None:
    with pytest.raises(ExprError) as info:
        compile_expr("args.x + 2 ** 3", NAMES)
    assert str(info.value) == "operator '**' not allowed (column 10) in expression: args.x + 2 ** 3"
    assert info.value.column == 10
    assert info.value.source == "args.x + 2 ** 3"


def test_column_counts_characters_not_bytes() -> None:
    with pytest.raises(ExprError) as info:
        compile_expr("'héllo' + foo", NAMES)
    assert info.value.column == 11


def test_syntax_error_becomes_expr_error() -> None:
    with pytest.raises(ExprError) as info:
        compile_expr("args.x ==", NAMES)
    assert not isinstance(info.value, SyntaxError)
    assert "syntax error" in str(info.value)
    assert "args.x ==" in str(info.value)


def test_non_string_source_is_an_expr_error() -> None:
    with pytest.raises(ExprError, match="expression must be a string, got bool"):
        compile_expr(True, NAMES)  # type: ignore[arg-type]


def test_names_must_not_be_a_bare_string() -> None:
    with pytest.raises(TypeError):
        compile_expr("args", "args")


def test_deep_nesting_is_a_compile_error_not_a_crash() -> None:
    with pytest.raises(ExprError):
        compile_expr("+".join(["1"] * 20000), NAMES)


def test_expr_error_pickles() -> None:
    with pytest.raises(ExprError) as info:
        compile_expr("foo", NAMES)
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is ExprError
    assert str(copy) == str(info.value)
    assert copy.column == 1


# ---- no execution at compile time ----


@pytest.mark.parametrize("source", ["1 / 0", "int('x')", "state.nope.deeper", "[1][5]", "min([])", "'a' < 1", "args.x"])
def test_compile_does_not_evaluate(source: str) -> None:
    e = compile_expr(source, NAMES)  # compiling must not fail: nothing is evaluated yet
    with pytest.raises(EvalError):
        e({"args": {}, "state": {}})


def test_compile_does_not_call_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def spy(value: Any) -> int:
        calls.append(value)
        return 99

    monkeypatch.setitem(runtime._FUNCTIONS, "len", (spy, 1, 1, ()))
    e = compile_expr("len(args.item_ids) + len([1])", NAMES)
    assert calls == []
    assert e(make_ctx()) == 198
    assert calls == [["a", "b"], [1]]


def test_malicious_source_is_rejected_without_side_effects(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for source in [
        f"__import__('os').system('touch {marker}')",
        f"open('{marker}', 'w')",
        f"args.__class__.__base__.__subclasses__()[0]('{marker}')",
        "[c for c in ().__class__.__base__.__subclasses__()]",
    ]:
        with pytest.raises(ExprError):
            compile_expr(source, NAMES)
    assert not marker.exists()


@pytest.mark.parametrize(
    "make",
    [
        lambda: compile_expr("sum(i.price * i.quantity for i in state.orders[args.order_id].items)", NAMES),
        lambda: render("order {args.order_id} in {oid}", NAMES),
        lambda: render("{oid}", NAMES),
        lambda: render("plain", NAMES),
    ],
)
def test_exprs_pickle_by_recompiling(make: Any) -> None:
    original = make()
    copy = pickle.loads(pickle.dumps(original))
    assert type(copy) is Expr
    assert copy.source == original.source
    assert copy.names == original.names
    assert copy(make_ctx()) == original(make_ctx())


def test_target_pickles(ctx: dict[str, Any]) -> None:
    copy = pickle.loads(pickle.dumps(compile_target("state.orders[args.order_id].status", NAMES)))
    assert type(copy) is Target
    container, key = copy.locate(ctx)
    assert container is ctx["state"]["orders"]["O1"] and key == "status"


def test_context_is_only_read(ctx: dict[str, Any]) -> None:
    before = repr(ctx)
    compile_expr("[x for x in args.items] + [k for k, v in items(state.orders)]", NAMES)(ctx)
    assert repr(ctx) == before


# ---- free names ----


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("1 + 2", set()),
        ("true and null", set()),
        ("args.x", {"args"}),
        ("state.orders[args.order_id]", {"args", "state"}),
        ("[x.a for x in args.items if x.b]", {"args"}),
        ("[oid for oid in state.log]", {"state"}),
        ("[oid for x in state.log] + [oid]", {"state", "oid"}),
        ("{k: v for k, v in items(state.orders)}", {"state"}),
    ],
)
def test_free_names(source: str, names: set[str]) -> None:
    e = compile_expr(source, NAMES)
    assert isinstance(e, Expr)
    assert e.names == frozenset(names)
    assert e.source == source


def test_source_is_stripped_and_repr() -> None:
    e = compile_expr("  args.x \n", NAMES)
    assert e.source == "args.x"
    assert repr(e) == "Expr('args.x')"


# ---- targets ----


def test_target_locates_container_and_key(ctx: dict[str, Any]) -> None:
    t = compile_target("state.orders[args.order_id].status", NAMES)
    assert isinstance(t, Target)
    assert t.root == "state"
    assert t.source == "state.orders[args.order_id].status"
    assert t.names == frozenset({"state", "args"})
    assert t.segments[0] == "orders"
    assert isinstance(t.segments[1], Expr) and t.segments[1].source == "args.order_id"
    assert t.segments[2] == "status"
    container, key = t.locate(ctx)
    assert container is ctx["state"]["orders"]["O1"]
    assert key == "status"
    container[key] = "returned"
    assert ctx["state"]["orders"]["O1"]["status"] == "returned"


@pytest.mark.parametrize(
    ("source", "path", "key"),
    [
        ("state.orders", (), "orders"),
        ("state['orders']", (), "orders"),
        ("state.orders[oid]", ("orders",), "O2"),
        ("state.orders.O1.items[0].price", ("orders", "O1", "items", 0), "price"),
        ("state.log[-1]", ("log",), -1),
        ("state.log[len(state.log) - 1]", ("log",), 2),
        ("state.orders.NEW", ("orders",), "NEW"),
    ],
)
def test_target_paths(ctx: dict[str, Any], source: str, path: tuple[Any, ...], key: Any) -> None:
    t = compile_target(source, NAMES)
    container, last = t.locate(ctx)
    expected = ctx["state"]
    for segment in path:
        expected = expected[segment]
    assert container is expected
    assert last == key


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("state.orders[args.missing_id].status", "no key 'O999' in state.orders"),
        ("state.nope.x", "no key 'nope' in state"),
        ("state.log[7].x", "index 7 out of range for state.log (length 3)"),
        ("state.orders.O1.status.x", "cannot assign into state.orders.O1.status: it is str"),
        ("state.log.x", "index into state.log must be an integer, got str"),
        ("state.orders[args.item_ids]", "unhashable key"),
        ("state.orders[args.nope]", "no key 'nope' in args"),
    ],
)
def test_target_locate_errors(ctx: dict[str, Any], source: str, message: str) -> None:
    with pytest.raises(EvalError, match=re.escape(message)):
        compile_target(source, NAMES).locate(ctx)


def test_target_missing_root() -> None:
    with pytest.raises(EvalError, match="name 'state' is not set"):
        compile_target("state.x", NAMES).locate({})


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("state", "a target must be a name followed by"),
        ("a + b", "a target must be a name followed by"),
        ("args.x + 1", "a target must be a name followed by"),
        ("f(x)", "a target must be a name followed by"),
        ("len(state).x", "a target must be a name followed by"),
        ("[1][0]", "a target must be a name followed by"),
        ("true.x", "a target must be a name followed by"),
        ("other.x", "unknown name 'other'"),
        ("state.__dict__", "attribute '__dict__' not allowed"),
        ("state.log[1:2]", "slices cannot be assigned to"),
        ("state.orders[foo]", "unknown name 'foo'"),
        ("state.orders[2 ** 3]", "operator '**' not allowed"),
        ("state.x =", "syntax error"),
    ],
)
def test_target_rejects_non_chains(source: str, message: str) -> None:
    with pytest.raises(ExprError, match=re.escape(message)):
        compile_target(source, NAMES)


# ---- render ----


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("order {args.order_id} not found", "order O1 not found"),
        ("{args.order_id}", "O1"),
        ("{args.amount}", "8"),
        ("{len(args.items)} items, total {args.amount * 2}", "3 items, total 16"),
        ("no placeholders", "no placeholders"),
        ("", ""),
        ("{{literal}} {oid}", "{literal} O2"),
        ("}}{{", "}{"),
        ("{ {'a': 1}['a'] }", "1"),
        ("{'}'} and {'{'}", "} and {"),
        ("value: {get(args, 'nope')}", "value: None"),
        ("flag={args.amount > 1}", "flag=True"),
        ("{[x.sku for x in args.items]}", "['x', 'y', 'z']"),
        ("{args.order_id}{oid}", "O1O2"),
    ],
)
def test_render(template: str, expected: str) -> None:
    assert render(template, NAMES)(make_ctx()) == expected


def test_render_names_and_source() -> None:
    r = render("order {args.order_id} in {oid}", NAMES)
    assert r.names == frozenset({"args", "oid"})
    assert r.source == "order {args.order_id} in {oid}"
    assert render("plain", NAMES).names == frozenset()


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("order {args.order_id", "unclosed '{'"),
        ("order } here", "single '}'"),
        ("empty {}", "bad placeholder {}: empty expression"),
        ("{foo}", "bad placeholder {foo}: unknown name 'foo'"),
        ("{args.x ** 2}", "operator '**' not allowed"),
        ("{args.x:>5}", "syntax error"),
        ("{args[}", "unclosed '{'"),
    ],
)
def test_render_errors(template: str, message: str) -> None:
    with pytest.raises(ExprError) as info:
        render(template, NAMES)
    assert message in str(info.value)
    assert template in str(info.value)


def test_render_evaluation_errors_propagate() -> None:
    with pytest.raises(EvalError, match=r"no key 'O999' in state\.orders"):
        render("status {state.orders[args.missing_id].status}", NAMES)(make_ctx())


# ---- properties ----

_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CMP = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def reference(node: ast.AST, env: dict[str, Any]) -> Any:
    """A tiny independent interpreter for the arithmetic/logic subset, using Python's own operators."""
    match node:
        case ast.Expression(body=body):
            return reference(body, env)
        case ast.Constant(value=value):
            return value
        case ast.Name(id=name):
            return env[name]
        case ast.BinOp(left=left, op=op, right=right):
            return _BIN[type(op)](reference(left, env), reference(right, env))
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            return -reference(operand, env)
        case ast.UnaryOp(op=ast.UAdd(), operand=operand):
            return +reference(operand, env)
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            return not reference(operand, env)
        case ast.BoolOp(op=op, values=values):
            result = None
            for value in values:
                result = reference(value, env)
                if bool(result) is not isinstance(op, ast.And):
                    return result
            return result
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            a = reference(left, env)
            for op, comparator in zip(ops, comparators, strict=True):
                b = reference(comparator, env)
                if not _CMP[type(op)](a, b):
                    return False
                a = b
            return True
        case ast.IfExp(test=test, body=body, orelse=orelse):
            return reference(body, env) if reference(test, env) else reference(orelse, env)
    raise AssertionError(f"unexpected node {ast.dump(node)}")


_leaves = st.one_of(st.integers(-6, 6).map(str), st.sampled_from(["x", "y", "z", "True", "False", "0.5"]))


def _extend(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binop = st.tuples(children, st.sampled_from(["+", "-", "*", "/", "//", "%"]), children)
    cmp_ops = st.sampled_from(["==", "!=", "<", "<=", ">", ">="])
    return st.one_of(
        binop.map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(children, cmp_ops, children).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(children, cmp_ops, children, cmp_ops, children).map(lambda t: "(" + " ".join(t) + ")"),
        st.tuples(children, st.sampled_from(["and", "or"]), children).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        children.map(lambda c: f"(not {c})"),
        children.map(lambda c: f"(-{c})"),
        st.tuples(children, children, children).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
    )


@pytest.mark.fuzz
@settings(max_examples=examples(100), deadline=None)
@given(
    source=st.recursive(_leaves, _extend, max_leaves=14),
    x=st.integers(-20, 20),
    y=st.integers(-20, 20),
    z=st.integers(-3, 3),
)
def test_arithmetic_matches_reference_interpreter(source: str, x: int, y: int, z: int) -> None:
    env = {"x": x, "y": y, "z": z}
    compiled = compile_expr(source, {"x", "y", "z"})
    try:
        expected = reference(ast.parse(source, mode="eval"), env)
    except ZeroDivisionError:
        with pytest.raises(EvalError, match="division by zero"):
            compiled(env)
        return
    result = compiled(env)
    assert result == expected
    assert type(result) is type(expected)


_small_dicts = st.dictionaries(st.text("abc", max_size=2), st.integers(-9, 9), max_size=5)


@given(d=_small_dicts, key=st.text("abc", max_size=2))
def test_lookup_functions_agree_with_python(d: dict[str, int], key: str) -> None:
    ctx = {"d": d, "k": key}
    assert compile_expr("has(d, k)", {"d", "k"})(ctx) is (key in d)
    assert compile_expr("k in d", {"d", "k"})(ctx) is (key in d)
    assert compile_expr("get(d, k, 'none')", {"d", "k"})(ctx) == d.get(key, "none")
    lookup = compile_expr("d[k]", {"d", "k"})
    if key in d:
        assert lookup(ctx) == d[key]
    else:
        with pytest.raises(EvalError, match=f"no key {key!r} in d"):
            lookup(ctx)


@given(xs=st.lists(st.integers(-50, 50), max_size=12))
def test_list_functions_agree_with_python(xs: list[int]) -> None:
    ctx = {"xs": xs}

    def run(source: str) -> Any:
        return compile_expr(source, {"xs"})(ctx)

    assert run("sum(xs)") == sum(xs)
    assert run("len(xs)") == len(xs)
    assert run("sorted(xs)") == sorted(xs)
    assert run("sorted(xs, reverse=true)") == sorted(xs, reverse=True)
    assert run("unique(xs)") == list(dict.fromkeys(xs))
    assert run("[v * 2 for v in xs if v % 2 == 0]") == [v * 2 for v in xs if v % 2 == 0]
    assert run("count(xs, 0)") == xs.count(0)
    assert run("any(v > 40 for v in xs)") == any(v > 40 for v in xs)
    assert run("all(v > -40 for v in xs)") == all(v > -40 for v in xs)
    assert run("xs[1:-1]") == xs[1:-1]
    if xs:
        assert run("min(xs)") == min(xs)
        assert run("max(v for v in xs)") == max(xs)
        assert run("xs[-1]") == xs[-1]
    else:
        with pytest.raises(EvalError, match=r"^min\(\)"):
            run("min(xs)")


@given(
    items=st.lists(st.fixed_dictionaries({"price": st.integers(0, 1000), "quantity": st.integers(0, 20)}), max_size=10),
    amount=st.integers(0, 20000),
)
def test_total_precondition_matches_formula(items: list[dict[str, int]], amount: int) -> None:
    e = compile_expr("sum(i.price * i.quantity for i in state.orders[args.order_id].items) >= args.amount", NAMES)
    ctx = {"args": {"order_id": "O1", "amount": amount}, "state": {"orders": {"O1": {"items": items}}}}
    assert e(ctx) is (sum(i["price"] * i["quantity"] for i in items) >= amount)


# ---- benchmark ----


def test_microbenchmark_prints_time_per_evaluation() -> None:
    ctx = make_ctx()
    cases = {
        "precondition": (
            "args.order_id in state.orders and state.orders[args.order_id].status == 'delivered'"
            " and len(args.item_ids) > 0"
        ),
        "sum over items": ("sum(i.price * i.quantity for i in state.orders[args.order_id].items) >= args.amount"),
        "effect value": ("{'order_id': oid, 'status': 'pending', 'items': [x for x in args.items if x.qty > 0]}"),
    }
    for label, source in cases.items():
        e = compile_expr(source, NAMES)
        assert e(ctx) is not None
        n = 20000
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(n):
                e(ctx)
            best = min(best, (time.perf_counter() - start) / n)
        print(f"\n[expr benchmark] {label}: {best * 1e6:.2f} µs/evaluation")


# ---- budgets: every measured runaway ends with a reason, never a hang or a crash ----


def chain(op: str, n: int) -> list[Expr]:
    """`x1 = x0 op x0`, `x2 = x1 op x1`, ...: the spec `let` chains that doubled a string or squared a number."""
    exprs, names = [], {"x0"}
    for i in range(1, n + 1):
        exprs.append(compile_expr(f"x{i - 1} {op} x{i - 1}", names))
        names.add(f"x{i}")
    return exprs


@pytest.mark.fuzz
@pytest.mark.parametrize(("op", "seed", "message"), [("+", "ab", "characters or elements"), ("*", 3, "bits")])
def test_doubling_and_squaring_lets_stop_at_the_budget(op: str, seed: Any, message: str) -> None:
    ctx: dict[str, Any] = {"x0": seed}
    exceeded = pytest.raises(expr_module.BudgetExceeded, match=f"evaluation budget exceeded: .*{message}")
    with exceeded as info, expr_module.metered():  # one tool call: its lets share a budget
        for i, e in enumerate(chain(op, 40), 1):
            ctx[f"x{i}"] = e(ctx)
    assert "evaluating: x" in str(info.value)  # names the expression


def test_each_let_alone_has_its_own_budget_too() -> None:
    ctx: dict[str, Any] = {"x0": "ab"}
    with pytest.raises(expr_module.BudgetExceeded, match="characters or elements"):
        for i, e in enumerate(chain("+", 40), 1):
            ctx[f"x{i}"] = e(ctx)
    assert len(ctx) < 26  # stopped near 2**23 characters, not at 2**41


@pytest.mark.fuzz
def test_nested_comprehension_is_stopped_by_steps() -> None:
    e = compile_expr("len([1 for a in args.s for b in args.s for c in args.s if a + b + c != ''])", NAMES)
    assert e({"args": {"s": "x" * 10}}) == 1000
    with pytest.raises(expr_module.BudgetExceeded, match=r"more than 1,000,000 steps evaluating: len\(\["):
        e({"args": {"s": "x" * 1000}})


def test_comprehension_nesting_and_expression_size_are_limited_at_compile_time() -> None:
    four = "[1 for a in args.s for b in args.s for c in args.s for d in args.s]"
    with pytest.raises(ExprError, match="more than 3 comprehension clauses nested"):
        compile_expr(four, NAMES)
    nested = "[[[[1 for d in args.s] for c in args.s] for b in args.s] for a in args.s]"
    with pytest.raises(ExprError, match="more than 3 comprehension clauses nested"):
        compile_expr(nested, NAMES)
    compile_expr("[[1 for c in args.s] for a in args.s for b in args.s]", NAMES)  # three: allowed
    compile_expr("[x for x in args.s] + [y for y in args.s] + [z for z in args.s]", NAMES)  # side by side
    with pytest.raises(ExprError, match="expression too large: more than 2000 syntax nodes"):
        compile_expr(" + ".join(["args.amount"] * 1000), NAMES)


@pytest.mark.fuzz
@pytest.mark.parametrize(
    "source",
    [
        "len(str(args.big) + str(args.big))",  # 2 x 6M characters
        "len(concat(args.many, args.many))",
        "len(sorted(args.many + args.many))",
        "len([args.text[1:] for x in args.many])",
        "len([args.text + 'x' for x in args.many])",
        "len(unique([[x] for x in args.many]))",
    ],
)
def test_building_large_values_is_stopped_by_size_or_steps(source: str) -> None:
    ctx = {"args": {"big": list(range(1_000_000)), "many": list(range(6_000_000)), "text": "y" * 100}}
    with pytest.raises(expr_module.BudgetExceeded, match="evaluation budget exceeded"):
        compile_expr(source, NAMES)(ctx)


def test_sum_takes_numbers_only() -> None:
    with pytest.raises(EvalError, match="the start must be a number"):
        ev("sum([[1], [2]], [])")


@pytest.mark.fuzz
def test_catastrophic_regular_expression_runs_in_linear_time() -> None:
    # The pattern and argument that took 14 s with Python's backtracking `re` (doubling with each character).
    e = compile_expr("matches(args.email, '(a+)+$')", NAMES)
    assert e({"args": {"email": "a" * 28 + "!"}}) is False
    assert e({"args": {"email": "a" * 100_000}}) is True


@pytest.mark.parametrize(
    ("pattern", "message"),
    [(r"(a)\\1", "invalid escape sequence"), ("(?=a)a", "invalid perl operator")],
)
def test_backtracking_only_syntax_is_refused_at_compile_time(pattern: str, message: str) -> None:
    with pytest.raises(ExprError, match=rf"bad regular expression \(RE2 syntax\): {re.escape(message)}"):
        compile_expr(f"matches(oid, '{pattern}')", NAMES)


def test_budget_exceeded_is_an_eval_error_that_rules_never_skip() -> None:
    from pipeline.envs._rules import Precondition, check_rules

    rule = Precondition(
        compile_expr("len([1 for a in args.s for b in args.s for c in args.s]) > 0", NAMES),
        render("too much", NAMES),
    )
    ctx = {"args": {"s": "x" * 1000}}
    for unknown_violates in (True, False):  # an observed rule is skipped when data is missing, never here
        check = check_rules([rule], ctx, unknown_violates)
        assert check.violated is rule
        assert check.message.startswith("rule not evaluated: evaluation budget exceeded: more than 1,000,000 steps")


@pytest.mark.fuzz
@pytest.mark.parametrize(
    "source",
    [
        "len([a for a in args.s if a in state.big])",  # membership scans the list in C: charged per element
        "len([a for a in args.s if count(state.big, a) > 0])",
        "len([a for a in args.s if max(state.big) > 0])",
    ],
)
def test_scans_done_in_c_are_charged(source: str) -> None:
    ctx = {"args": {"s": list(range(1000))}, "state": {"big": list(range(100_000))}}
    with pytest.raises(expr_module.BudgetExceeded, match="more than 1,000,000 steps"):
        compile_expr(source, NAMES)(ctx)
    ctx["args"]["s"] = list(range(5))  # 5 scans of 100,000: within the budget
    assert compile_expr(source, NAMES)(ctx) == 5


def test_lookups_in_objects_are_not_charged_as_scans() -> None:
    # Membership in an object, has() and get() take constant time: a rule over every user against a large
    # order table stays far within the budget (as τ-bench's policies over their databases do).
    orders = {f"O{i}": {"user": f"U{i % 500}"} for i in range(100_000)}
    ctx = {"args": {"ids": [f"O{i}" for i in range(0, 100_000, 50)]}, "state": {"orders": orders}}
    source = "len([i for i in args.ids if i in state.orders and has(state.orders, i) and get(state.orders, i)])"
    assert compile_expr(source, NAMES)(ctx) == 2000


# ---- compiled code: the same values, errors and budget as the closures ----


def _outcome(expr: Expr, ctx: dict[str, Any]) -> tuple[Any, ...]:
    """What one evaluation inside a tool call gives: its value or error, and the budget it left."""
    with expr_module.metered():
        try:
            result: tuple[Any, ...] = ("value", expr(ctx))
        except EvalError as exc:
            result = (type(exc).__name__, str(exc))
        meter = budget._active.meter
        left = (meter.steps, meter.size) if isinstance(meter, budget._Meter) else None
    return (*result, left)


_ATOMS = st.sampled_from(
    [
        "args.xs", "args.s", "args.n", "args.d", "state.orders", "state.k", "null", "true", "1", "-2.5", "'a'",
        "args.xs[0]", "args.missing", "state.orders['O1']", "x", "y",
    ]
)  # fmt: skip


def _grow_source(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    pair = st.tuples(inner, inner)
    return st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "//", "%"]), inner).map(" ".join).map("({})".format),
        # Parenthesised: a chain (`a == b == c`) is left to the closures (pipeline.expr._fast._Translator._Compare).
        st.tuples(inner, st.sampled_from(["==", "!=", "<", ">=", "in", "not in", "is"]), inner)
        .map(" ".join)
        .map("({})".format),
        st.tuples(inner, st.sampled_from(["and", "or"]), inner).map(" ".join).map("({})".format),
        inner.map("(not {})".format),
        inner.map("(-{})".format),
        inner.map("{}.status".format),
        pair.map("{0[0]}[{0[1]}]".format),
        inner.map("{}[1:]".format),
        pair.map("[{0[0]}, {0[1]}]".format),
        pair.map("{{'k': {0[0]}, 'j': {0[1]}}}".format),
        st.tuples(inner, inner, inner).map("({0[0]} if {0[1]} else {0[2]})".format),
        st.tuples(
            st.sampled_from(["len", "str", "sorted", "unique", "sum", "max", "keys", "values", "lower", "any"]), inner
        ).map("{0[0]}({0[1]})".format),
        pair.map("get({0[0]}, {0[1]})".format),
        pair.map("[{0[0]} for x in {0[1]}]".format),
        st.tuples(inner, inner, inner).map("[{0[0]} for x in {0[1]} if {0[2]}]".format),
        st.tuples(inner, inner, inner).map("[{0[0]} for x in {0[1]} for y in {0[2]}]".format),
        pair.map("any({0[0]} for x in {0[1]})".format),
        pair.map("sum({0[0]} for y in {0[1]})".format),
        pair.map("{{x: {0[0]} for x in {0[1]}}}".format),
        inner.map("matches({}, '[a-z]+')".format),
    )


@pytest.mark.fuzz
@settings(max_examples=examples(100), deadline=None)
@given(source=st.recursive(_ATOMS, _grow_source, max_leaves=8))
def test_compiled_code_gives_the_closures_values_errors_and_budget(source: str) -> None:
    try:
        expr = compile_expr(source, {"args", "state", "x", "y"})
    except ExprError:
        return
    assert expr._fast is not None, source
    closures = Expr(expr.source, expr.names, expr._fn)
    ctx = {
        "args": {"xs": [3, 1, 2], "s": "abc", "n": 7, "d": {"a": 1, "b": True}},
        "state": {"orders": {"O1": {"status": "done", "total": 9.5}}, "k": list(range(100))},
        "x": "O1",
        "y": 2,
    }
    assert _outcome(expr, ctx) == _outcome(closures, ctx), source


def test_every_shop_expression_is_compiled_to_code() -> None:
    from pipeline.envs import get_environment

    spec = get_environment("shop").spec  # type: ignore[attr-defined]
    exprs = [
        e
        for rules in spec.tools.values()
        for e in (
            *(p.require for p in rules.preconditions),
            *(e for _, e in rules.let),
            *(e.value for e in rules.effects if e.value),
            *(e.each[1] for e in rules.effects if e.each),
            *([rules.returns] if rules.returns else []),
        )
    ]
    assert len(exprs) > 50 and all(e._fast is not None for e in exprs)


def test_compiled_code_reaches_no_builtins() -> None:
    fast = compile_expr("len(args.xs) + 1", NAMES)._fast
    assert fast is not None and fast.__globals__["__builtins__"] == {}
    assert set(fast.__globals__) == {
        "__builtins__",
        "_loop",
        "_in",
        "_neg",
        "_pos",
        "_cut",
        "_add",
        "_mul",
        "_mod",
        "_f_len",
    }


def test_a_failing_compiled_evaluation_leaves_the_budget_as_the_closures_do() -> None:
    # The compiled code charges the loop, then fails on a missing key; the closures run from the same budget.
    expr = compile_expr("[args.items[i].nope for i in [0, 1, 2]]", NAMES)
    closures = Expr(expr.source, expr.names, expr._fn)
    outcome = _outcome(expr, make_ctx())
    assert outcome[0] == "EvalError" and "no key 'nope'" in outcome[1]
    assert outcome == _outcome(closures, make_ctx())
