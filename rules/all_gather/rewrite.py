"""The rewrite of the all_gather rule: where its waits or notifies go in the user's kernel."""

from __future__ import annotations

import dataclasses

import libcst as cst
import libcst.matchers as m

from tilelink.analysis import Access, KernelAnalysis, Where, code, names_in, parse_offsets
from tilelink.errors import AnnotationError
from tilelink.plan import AllGatherLaunch, Insertion, ReportEntry, RewritePlan
from tilelink.rules.emit import (
    CHANNEL_PARAMS,
    MAPPING_ARGS,
    channels_of_row_vector,
    channels_of_tile,
    describe_rows,
    remap_order,
    tile_end,
)
from tilelink.spec import AllGatherSpec, Options

RULE = "all_gather"
DEFAULTS = dict(via="sm", mode="pull", order="local_first", comm_sms=16)


def _flat_hint(access: Access) -> str | None:
    """For rows ``(base + offs)[:, None]`` (a block's rows of a flat layout, ``off_hz * N_CTX + offs``): the view
    and annotation that gather them along the blocks' inner dimension."""
    rows = next((code(sub.value) for sub in m.findall(cst.parse_expression(access.pointer), m.Subscript(
        value=m.BinaryOperation(operator=m.Add()), slice=[m.SubscriptElement(slice=m.Slice()), m.SubscriptElement(
            slice=m.Index(value=m.Name("None")))]))), None)
    if rows is None:
        return None
    return (f"the rows `{rows}` are a block's rows of a flat layout (row z * H * S + h * S + s of a (Z * H * S, D) "
            f"matrix) when the first term starts a block: to gather S inside each block, pass each rank's shard as "
            f"its (Z * H, S_r, D) view and annotate dim=1 with the key block's start along S, e.g. all_gather("
            f"{access.tensor!r}, dim=1, tile=(\"start_n\", \"BLOCK_N\"), size=\"S\"); else index the rows with "
            f"`offs[:, None]` for `offs = start + tl.arange(0, BLOCK)`")


def _axis_hint(an: KernelAnalysis, access: Access, dim: int, size: str | None) -> str | None:
    """For a gather along an inner dim whose load indexes its rows at another axis of the block (a batched
    ``x_ptr + pid_b * stride_xb + offs_s[:, None] * stride_xs + offs_d[None, :]`` over a (B, S, D) tensor gathered
    along S, dim=1): the ``tile=`` that names those rows, and, where the pointer is advanced in place, the address
    to compute instead. Without ``tile=`` the rows along dim ``d`` are read from the vector at axis ``d`` of the
    block (``offs[None, :]`` for dim 1), which this load does not index as rows."""
    if dim == 0:
        return None
    exprs, names, todo = [], set(), [access.pointer]
    while todo and len(exprs) < 32:
        source = todo.pop()
        exprs.append(cst.parse_expression(source))
        for name in names_in(exprs[-1]) - names:
            names.add(name)
            if name in an.values and name not in an.params:
                todo.extend(v for v in an.values[name] if name not in names_in(cst.parse_expression(v)))
    found = []
    for e in exprs:
        for sub in m.findall(e, m.Subscript(value=m.Name())):
            kinds = ["slice" if isinstance(el.slice, cst.Slice) else "none" if m.matches(
                el.slice, m.Index(value=m.Name("None"))) else "other" for el in sub.slice]
            if kinds.count("slice") != 1 or "other" in kinds or kinds.index("slice") == dim:
                continue
            values = an.values.get(sub.value.value, ())
            parsed = parse_offsets(cst.parse_expression(values[0])) if len(values) == 1 else None
            if parsed is not None and parsed[0] != "0" and (sub.value.value, *parsed) not in found:
                found.append((sub.value.value, *parsed))
    if len(found) != 1:
        return None
    vector, start, block = found[0]
    full = size or f"<the full size of dim {dim}>"
    advanced = sorted(n for n in names if n in an.rebound and n in an.values and n != access.tensor)
    hint = (f"TileLink reads the rows along dim {dim} from the vector at axis {dim} of the block, which this load "
            f"does not index as rows; if `{vector}` are its rows along dim {dim}, name them: all_gather("
            f"{access.tensor!r}, dim={dim}, tile=(\"{start}\", \"{block}\"), size=\"{full}\")")
    if advanced:
        hint += (f", and compute the address in the loop from the loop variable (`ks = k * BLOCK_K + offs_k`, "
                 f"`{access.tensor} + ... + ks[None, :] * stride`) instead of advancing `{advanced[0]}` in place: "
                 f"with tile= TileLink bounds the rows of an address bound once")
    return hint


def _computed_from_index(an: KernelAnalysis, access: Access, loaded: str,
                         dim: int) -> tuple[str, str, bool] | None:
    """``(rows, value, alone)`` where the rows the address of ``access`` indexes along ``dim`` (`rows[:, None]`) are
    computed from the loaded index ``loaded`` rather than being it (`kv_loc = kv_page_number * PAGE_SIZE + offs_n %
    PAGE_SIZE`); ``alone``: the value reads nothing else but parameters (`rows = tok // top_k`, which index= reads
    written in the address). ``None`` where the address indexes the loaded values themselves, or its rows are not one
    name bound once."""
    todo, seen, rows = [access.pointer], set(), set()
    while todo:
        node = cst.parse_expression(todo.pop())
        rows |= {sub.value.value for sub in m.findall(node, m.Subscript(value=m.Name()))
                 if [i for i, e in enumerate(sub.slice) if isinstance(e.slice, cst.Slice)] == [dim]}
        for name in names_in(node) - seen:
            seen.add(name)
            if name != loaded:
                todo.extend(an.values.get(name, ()))
    if loaded in rows or len(rows - {loaded}) != 1:
        return None
    (name,) = rows - {loaded}
    values = an.values.get(name, ())
    if len(values) != 1 or loaded not in names_in(value := cst.parse_expression(values[0])):
        return None
    return name, values[0], not names_in(value) - {loaded, "tl", "triton"} - set(an.params)


def _index_hint(an: KernelAnalysis, access: Access, spec: AllGatherSpec) -> str | None:
    """For a load whose rows TileLink cannot tell, what to do where they come from a loaded index: pass `index=`
    (when the spec has none), write rows computed from the index alone in the address, or, for rows made from it
    and more (a page table's), why `index=` does not read them."""
    behind = an.index_behind(access)
    if behind is None:
        return None
    loaded, source = behind
    if spec.index and spec.index != source:
        return (f"the rows come from `{loaded}`, loaded from {source!r}, not from {spec.index!r}: pass "
                f"index=\"{source}\" to all_gather(...)")
    computed = _computed_from_index(an, access, loaded, spec.dim)
    if computed is None:
        return None if spec.index else (f"the rows come from `{loaded}`, loaded from {source!r}: pass index=\""
                                        f"{source}\" and size=\"<the full row count>\" to all_gather(...)")
    rows, value, alone = computed
    said = f"the rows are `{rows}`, computed from `{loaded}`, loaded from {source!r} (`{rows} = {value}`)"
    if alone:
        return (f"{said}: all_gather's index= reads the loaded values where the address uses them, or a block from a "
                f"loaded start (`rows = (start + tl.arange(0, BLOCK_M)).to(tl.int64)`); write them so, "
                f"`{loaded}[:, None]` (also `{loaded}[:, None] // top_k`), and pass index=\"{source}\" and "
                f"size=\"<the full row count>\"")
    return (f"{said}, as through a page table: all_gather's index= reads rows that are the loaded values themselves "
            f"(`{access.tensor} + rows[:, None] * stride`, also `rows[:, None] // top_k`) or a block from a loaded "
            f"start (`rows = start + tl.arange(0, BLOCK_M)`, bound once), and TileLink does not gather through a "
            f"table of pages; gather the rows this load reads into a buffer of their own, indexed so, or leave this "
            f"kernel as it is")


def _check_token_carriers(an: KernelAnalysis, tokens: list[str], a: Access) -> None:
    """The wait's token is added to each pointer the tile's loads go through after it (`ptrs = ptrs + tlk_token`),
    which keeps those loads after the wait: a name holding the pointer in a tuple or a list cannot carry it."""
    for name in tokens:
        for source, at in zip(an.values.get(name, ()), an.assignments.get(name, ()), strict=False):
            held = cst.parse_expression(source)
            if isinstance(held, (cst.Tuple, cst.List)):
                kind = "tuple" if isinstance(held, cst.Tuple) else "list"
                raise AnnotationError(
                    f"`{name}` holds {a.tensor!r} in a {kind} (`{name} = {source}`), and the load at line "
                    f"{a.where.line} reads through it: the wait's token, which keeps the load after the wait, is added "
                    f"to the pointer the load goes through, and a {kind} cannot carry it",
                    file=at.file, line=at.line, column=at.column,
                    hint=f"bind each pointer to a name of its own (`{name}_0 = {a.tensor}`) and load through it")


def _loop_targets(an: KernelAnalysis, group: list[Access], anchor: Where, tokens: list[str]) -> list[str]:
    """The targets of the loops around the wait that a descriptor load's offsets read (`for start in range(lo, hi,
    BLOCK)`: `desc.load([start, 0])`): they carry the token too. Nothing else orders such a load after this
    iteration's wait; a pipelined loop may issue a later iteration's load while an earlier one runs, before its
    wait. A `tl.static_range` target stays as it is (a constexpr the load may need)."""
    static = {src.split(" := ", 1)[0].lstrip("(") for src, _ in an.effects
              if " := tl.static_range(" in src or " := triton.language.static_range(" in src}

    def around(name: str) -> bool:  # a `for` loop binding `name` holds the wait
        return any(end is not None and (at.line, at.column) < (anchor.line, anchor.column) < (end.line, end.column)
                   for at, end in an.bindings.get(name, ()))

    read = {n for x in group if x.descriptor and x.offsets for n in names_in(cst.parse_expression(x.offsets))}
    return sorted(n for n in read if n not in tokens and n not in static and around(n))


def rewrite(an: KernelAnalysis, spec: AllGatherSpec, options: Options) -> RewritePlan:
    """Plan the consumer-side rewrite of ``an`` for ``spec``."""
    opts = options.resolved(**DEFAULTS)
    report: list[ReportEntry] = []
    insertions: list[Insertion] = []
    loads = [a for t in spec.tensors for a in an.accesses_of(t, "load")]
    if not loads:
        names = " or ".join(repr(t) for t in spec.tensors)
        raise AnnotationError(
            f"kernel {an.name!r} never loads from {names} (through tl.load or a tensor descriptor)",
            file=an.file, line=an.where.line, column=an.where.column,
            hint="annotate the pointer the kernel reads, or remove the all_gather spec")
    # a store to a gathered tensor is refused by the analysis (``read_only``), before its address is read
    untiled = [a for a in loads if a.tile is None]
    if untiled:
        a = untiled[0]
        raise AnnotationError(
            f"cannot tell which rows along dim {spec.dim} of {a.tensor!r} this load reads "
            f"(pointer `{a.pointer}`)", file=a.where.file, line=a.where.line, column=a.where.column,
            hint=_index_hint(an, a, spec) or an.row_program_misses.get(a.where) or _flat_hint(a)
            or _axis_hint(an, a, spec.dim, spec.size)
            or "compute the offsets as `offs = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)` and index with offs[:, None], "
               "or pass tile=(\"<start>\", \"<size>\") to all_gather(...)")
    # in the order they run: a group's wait goes before its first load, whichever tensor that load reads (a row
    # scale loaded before the K loop that loads the rows)
    loads.sort(key=lambda a: (a.anchor.line, a.anchor.column, a.where.line, a.where.column))
    first = loads[0]
    tile = first.tile
    assert tile is not None and first.anchor is not None
    if tile.dynamic and spec.size is None:
        raise AnnotationError(
            f"all_gather with index={spec.index!r} needs the full row count of {first.tensor!r}",
            file=first.where.file, line=first.where.line, column=first.where.column,
            hint="pass size=\"<parameter or expression of parameters>\", e.g. size=\"num_valid_tokens // top_k\"")
    if tile.size_param is None and spec.size is None:
        one_row = tile.offsets is None and tile.size == "1" and tile.ndim == 1
        raise AnnotationError(
            f"cannot find the parameter holding the full size of dim {spec.dim} of {first.tensor!r}"
            + (f": this load reads one row a program (`{tile.start}`), and nothing in the kernel counts the rows"
               if one_row else ""),
            file=first.where.file, line=first.where.line, column=first.where.column,
            hint=(f"pass size=\"<the full row count>\" to all_gather(...), an int parameter of the kernel (add one, "
                  f"`M`, passed the gathered tensor's rows, if it has none), or loop over the rows up to it (`for "
                  f"{tile.start} in tl.range(start, M, step)`)") if one_row else
                 f"mask the load with `{tile.offsets or 'offs'}[:, None] < M`, or pass size=\"M\" to "
                 f"all_gather(...)")
    size_param = spec.size or tile.size_param
    # one wait per tile: loads of the same tile (the same start defined by the same statement, so in the
    # same block) share the wait placed before the first of them
    groups: dict = {}
    for a in loads:
        t = a.tile
        key = (t.start, t.size, t.defined_at)
        if t.dynamic:
            key = ("dynamic", t.start, t.defined_at)
        groups.setdefault(key, []).append(a)
    for group in groups.values():
        a = group[0]
        t = a.tile
        if any(x.tile.wraps for x in group):  # one load of the tile whose rows wrap to the start: the wait covers them
            t = dataclasses.replace(t, wraps=True)
        # the names that exist at the wait: an alias assigned after it, before a later load of the group, is made
        # from names that already carry the token
        tokens = sorted({n for x in group for n in x.earlier_aliases if n in an.params or any(
            (w.line, w.column) < (a.anchor.line, a.anchor.column) for w in an.assignments.get(n, ()))})
        if t.dynamic:
            lines = [
                f"# tilelink: wait for the channels holding the rows {t.start} this tile gathers from "
                f"{', '.join(spec.tensors)} (all_gather, dynamic mapping through {spec.index})",
                *channels_of_row_vector(t.start),
                "tlk_token = tll.consumer_tile_wait_channels(\n    tlk_barriers, tlk_channel, tlk_target, tlk_diag, "
                "tlk_budget, scaled=True, ready=tlk_ready)",
            ]
        else:
            lines = [
                f"# tilelink: wait until rows [{t.start}, {t.start} + {t.size}) of "
                f"{', '.join(spec.tensors)} have arrived (all_gather, dim {spec.dim})",
                channels_of_tile(t),
                "tlk_token = tll.consumer_tile_wait(\n    tlk_barriers, tlk_first, tlk_count, tlk_target, tlk_diag, "
                "tlk_budget, scaled=True, ready=tlk_ready)",
            ]
            if t.wraps:  # the rows past the end read the first rows again: wait for those too
                lines += [
                    "# tilelink: and for the rows its offsets wrap to, at the start",
                    f"tlk_first, tlk_count = tlm.tl_channels_of_rows(\n    0, {tile_end(t)} - tlk_rows,\n"
                    f"    {MAPPING_ARGS})",
                    "tlk_token += tll.consumer_tile_wait(\n"
                    "    tlk_barriers, tlk_first, tlk_count, tlk_target, tlk_diag, tlk_budget, scaled=True, "
                    "ready=tlk_ready)",
                ]
        tokens += _loop_targets(an, group, a.anchor, tokens)
        _check_token_carriers(an, tokens, a)
        lines += [f"{n} = {n} + tlk_token" for n in tokens]
        if any(x.descriptor for x in group) and not tokens:
            report.append(ReportEntry(an.name, RULE, "note",
                                      "the tensor-descriptor load's offset is an expression: no token carried; "
                                      "assign the tile start to a variable so that it can carry one", a.where))
        insertions.append(Insertion(a.anchor, "before", tuple(lines)))
        rows = describe_rows(t)
        report.append(ReportEntry(
            an.name, RULE, "applied",
            f"consumer_tile_wait before line {a.anchor.line} (guards the reads of "
            f"{', '.join(sorted({x.tensor for x in group}))} at line(s) "
            f"{', '.join(str(x.where.line) for x in group)}; {rows})", a.anchor))
    # every wait's target read once, at the program's start: a captured call's count (a word the graph advances
    # before the launch) is fixed for the launch, and a load before each wait delayed its first poll
    assert an.body_first is not None  # the body loads from the gathered tensor
    insertions.insert(0, Insertion(an.body_first, "before", (
        "# tilelink: this call's barrier target (fixed for the launch: read once), and whether every channel has",
        "# arrived already (one read of them all: then each wait below passes without polling)",
        "tlk_target = tll.call_target(tlk_epoch, tlk_diag)",
        "tlk_ready = tll.channels_ready(tlk_barriers, tlk_world * tlk_channels_per_rank, tlk_target)")))
    shift = "tlk_rank * tlk_rows_per_rank" if tile.size == "1" else f"(tlk_rank * tlk_rows_per_rank) // ({tile.size})"
    rotations: tuple[tuple[str, str, str, str, int, bool], ...] = ()
    if tile.dynamic:
        report.append(ReportEntry(an.name, RULE, "note", f"dynamic mapping through {spec.index}: each tile "
                                  "waits for the channels of the rows it gathers; tiles keep the kernel's order"))
    elif opts.order in ("local_first", "ring"):
        more, entry, rotations = remap_order(an, first, RULE, opts.order, shift)
        insertions += more
        report.append(entry)
    else:
        report.append(remap_order(an, first, RULE, opts.order, shift)[1])
    partners = {"copy_engine": (), "sm": ("ag_pull_producer",) if opts.mode == "pull" else ("ag_push_producer",)}
    launch = AllGatherLaunch(
        tensors=spec.tensors, dim=spec.dim, size_param=size_param, index=spec.index,
        via=opts.via, mode=opts.mode, order=opts.order, comm_block=opts.comm_block,
        comm_sms=opts.comm_sms, channels_per_rank=opts.channels_per_rank, rotations=rotations,
    )
    report.append(ReportEntry(an.name, RULE, "note",
                              f"producer: {opts.via}" + (f" {opts.mode}" if opts.via == "sm" else "")
                              + f", {opts.comm_sms if opts.via == 'sm' else 'no'} SMs, comm tile "
                              + (f"{opts.comm_block} rows" if opts.comm_block
                                 else "a rank's rows" if opts.via == "copy_engine" else "128 rows")))
    return RewritePlan(an.name, RULE, spec, opts, CHANNEL_PARAMS, tuple(insertions), partners[opts.via],
                       launch, tuple(report))
