"""Read ``@tilelink.overlap(...)`` annotations from source text, without importing the file.

``tlxform build`` and ``tlxform check`` work on files that may need a GPU or a world to import;
so the annotations are read statically: spec constructors with literal arguments.
"""

from __future__ import annotations

import ast

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from tilelink.analysis import parse_source
from tilelink.codegen import Request
from tilelink.errors import AnnotationError
from tilelink.spec import all_gather, all_reduce, make_options, reduce_scatter

_CONSTRUCTORS = {"all_gather": all_gather, "reduce_scatter": reduce_scatter, "all_reduce": all_reduce}


def _callee(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Name):
        return node.value
    return None


def requests_in(source: str, file: str) -> list[Request]:
    """Every annotated kernel of ``source`` as a :class:`~tilelink.codegen.Request`."""
    module = parse_source(source, file)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    requests: list[Request] = []
    for stmt in module.body:
        if not isinstance(stmt, cst.FunctionDef):
            continue
        for dec in stmt.decorators:
            call = dec.decorator
            if not (isinstance(call, cst.Call) and _callee(call.func) == "overlap"):
                continue
            pos = positions[dec].start
            line = pos.line

            def literal(node: cst.CSTNode, what: str, _line: int = line, _col: int = pos.column + 1):
                text = cst.Module(body=[]).code_for_node(node)
                try:
                    return ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise AnnotationError(
                        f"{what} must be a literal to be read by tlxform, got `{text}`", file=file,
                        line=_line, column=_col, hint="write the value itself, not a variable") from None

            specs = []
            options: dict = {}
            for arg in call.args:
                if arg.keyword is not None:
                    options[arg.keyword.value] = literal(arg.value, f"option {arg.keyword.value}=")
                    continue
                value = arg.value
                name = _callee(value.func) if isinstance(value, cst.Call) else None
                if name not in _CONSTRUCTORS:
                    raise AnnotationError(
                        "@tilelink.overlap takes tilelink.all_gather(...), tilelink.reduce_scatter(...) or "
                        f"tilelink.all_reduce(...) specs, got `{cst.Module(body=[]).code_for_node(value)}`",
                        file=file, line=line, column=pos.column + 1,
                        hint="write e.g. @tilelink.overlap(tilelink.all_gather(\"a_ptr\"))")
                args = [literal(a.value, f"{name} argument") for a in value.args if a.keyword is None]
                kwargs = {a.keyword.value: literal(a.value, f"{name} {a.keyword.value}=")
                          for a in value.args if a.keyword is not None}
                try:
                    specs.append(_CONSTRUCTORS[name](*args, **kwargs))
                except (TypeError, ValueError) as exc:
                    raise AnnotationError(str(exc), file=file, line=line, column=pos.column + 1,
                                          hint=f"see help(tilelink.{name})") from None
            try:
                opts = make_options(**options)
            except (TypeError, ValueError) as exc:
                raise AnnotationError(str(exc), file=file, line=line, column=pos.column + 1,
                                      hint="see help(tilelink.overlap)") from None
            requests.append(Request(stmt.name.value, tuple(specs), opts, line))
    return requests
