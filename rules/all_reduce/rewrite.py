"""The rewrite of the all_reduce rule: the notifies after the user's stores of partial sums.

The producer side is the reduce-scatter's (:func:`tilelink.rules.reduce_scatter.rewrite.notify_stores`): the same
soundness checks of what is stored, the same count of the elements each store completes in each channel, the
same tile order; only the partner kernels differ, which read every channel instead of a rank's own."""

from __future__ import annotations

from dataclasses import replace

from tilelink.analysis import KernelAnalysis
from tilelink.errors import AnnotationError
from tilelink.plan import AllReduceLaunch, Insertion, ReportEntry, RewritePlan
from tilelink.rules.emit import CHANNEL_PARAMS
from tilelink.rules.reduce_scatter.rewrite import (
    check_sliced_reads,
    notify_stores,
    split_k,
    split_k_note,
    split_steps,
    stored_tiles,
    sums_dtypes,
    whole_steps,
)
from tilelink.spec import AllReduceSpec, Options

RULE = "all_reduce"
DEFAULTS = dict(via="sm", mode="pull", order="ring", comm_sms=16)


def _named(insertion: Insertion) -> Insertion:
    """``insertion`` with its comments naming this rule: the shared producer code names the reduce-scatter."""
    lines = tuple(line.replace("(reduce_scatter", f"({RULE}") if line.lstrip().startswith("#") else line
                  for line in insertion.lines)
    return replace(insertion, lines=lines)


def rewrite(an: KernelAnalysis, spec: AllReduceSpec, options: Options) -> RewritePlan:
    """Plan the producer-side rewrite of ``an`` for ``spec``."""
    opts = options.resolved(**DEFAULTS)
    if opts.via != "sm" or opts.mode != "pull":
        chosen = f"via={opts.via!r}" if opts.via != "sm" else f"mode={opts.mode!r}"
        raise AnnotationError(
            f"all_reduce runs on SMs and pulls the peers' partial sums; {chosen} is not one of its options",
            file=an.file, line=an.where.line, column=an.where.column,
            hint="drop the option; all_reduce(..., mode=\"one_shot\") or mode=\"two_shot\" picks the algorithm")
    insertions, report, size_param, refused, rotations, first_rank = notify_stores(an, spec, opts, RULE)
    algorithm = {"one_shot": "one-shot: every rank pulls every peer's partial rows of every channel and sums them",
                 "two_shot": "two-shot: each rank sums its rows' channels from every peer (reduce-scatter), then "
                             "pulls the other ranks' summed rows (all-gather)",
                 None: "one-shot or two-shot, chosen by the message's size at the first call of each shape"}
    report.append(ReportEntry(an.name, RULE, "note", f"consumer: SM mesh pull on {opts.comm_sms} programs, "
                                                     f"{algorithm[spec.mode]}"))
    found = split_k(an, spec)
    check_sliced_reads(an, spec)
    report += split_k_note(an, found, RULE)
    launch = AllReduceLaunch(tensors=spec.tensors, dim=spec.dim, size_param=size_param, algorithm=spec.mode,
                             atomic_axes=None if found is None else tuple(found[0]),
                             atomic_when="" if found is None else found[1],
                             via=opts.via, mode=opts.mode, order=opts.order, comm_block=opts.comm_block,
                             comm_sms=opts.comm_sms, channels_per_rank=opts.channels_per_rank, refused=refused,
                             stored_tiles=stored_tiles(an, spec), sums_dtypes=sums_dtypes(an, spec),
                             first_rank_only=first_rank, rotations=rotations, split_steps=split_steps(an),
                             row_multiples=whole_steps(an))
    partners = ("ar_pull_reduce",) if spec.mode == "one_shot" else ("ar_pull_reduce", "ar_gather_rows")
    return RewritePlan(an.name, RULE, spec, opts, CHANNEL_PARAMS, tuple(_named(i) for i in insertions), partners,
                       launch, tuple(report))
