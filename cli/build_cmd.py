"""``tlxform build``, ``tlxform show`` and ``tlxform check``: the rewriter from the command line.

Exit codes: 0 everything rewritten; 1 an annotation could not be applied (the message names the
file, line and what to do); 3 (with ``--strict``) generated, but the report lists a rewrite that was
not applied; 2 bad usage.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import click

from tilelink.errors import AnnotationError


def _generate(path: str):
    from tilelink.overlapped import build  # imported here: `tlxform --help` need not load the rewriter

    return build(path)


def _fail(exc: AnnotationError) -> None:
    click.secho(f"error: {exc}", fg="red", err=True)


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--out", "out_dir", default="generated", show_default=True, type=click.Path(file_okay=False),
              help="directory for the generated modules (<stem>_tilelink.py)")
@click.option("--strict", is_flag=True, help="exit 3 when a rewrite was not applied")
@click.option("-q", "--quiet", is_flag=True, help="print only errors and the written paths")
def build(files: tuple[str, ...], out_dir: str, strict: bool, quiet: bool) -> None:
    """Rewrite the annotated kernels of FILES into overlapped Triton modules and print the report."""
    status = 0
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for path in files:
        try:
            gen = _generate(path)
        except AnnotationError as exc:
            _fail(exc)
            status = 1
            continue
        target = Path(out_dir) / f"{Path(path).stem}_tilelink.py"
        target.write_text(gen.text)
        click.echo(f"wrote {target}")
        if not quiet:
            click.echo(str(gen.report))
        if strict and not gen.report.applied and status == 0:
            status = 3
    sys.exit(status)


@click.command()
@click.argument("target", metavar="FILE::KERNEL")
def show(target: str) -> None:
    """Print the unified diff of KERNEL before and after the rewrite."""
    path, sep, kernel = target.partition("::")
    if not sep or not kernel:
        raise click.BadParameter("write FILE::KERNEL, e.g. examples/ag_gemm.py::matmul_kernel",
                                 param_hint="FILE::KERNEL")
    if not Path(path).is_file():
        raise click.BadParameter(f"no such file: {path}", param_hint="FILE::KERNEL")
    try:
        gen = _generate(path)
    except AnnotationError as exc:
        _fail(exc)
        sys.exit(1)
    if kernel not in gen.originals:
        known = ", ".join(sorted(gen.originals)) or "none"
        click.secho(f"error: {path} has no annotated kernel {kernel!r} (annotated: {known})", fg="red", err=True)
        sys.exit(1)
    # every line ends with its newline: difflib would join a last line without one to the next line it prints
    before = [line.rstrip("\n") + "\n" for line in gen.originals[kernel].splitlines()]
    after = [line.rstrip("\n") + "\n" for line in gen.rewritten[kernel].splitlines()]
    sys.stdout.writelines(difflib.unified_diff(before, after, f"{path}::{kernel}", f"{path}::{kernel} (tilelink)"))


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
def check(files: tuple[str, ...]) -> None:
    """Analyse the annotated kernels of FILES and print what the rewrite would do; write nothing."""
    status = 0
    for path in files:
        try:
            gen = _generate(path)
        except AnnotationError as exc:
            _fail(exc)
            status = 1
            continue
        click.echo(f"{path}: ok")
        click.echo(str(gen.report))
    sys.exit(status)
