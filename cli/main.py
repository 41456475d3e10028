"""``tlxform``: build, inspect and run TileLink overlapped kernels.

Each sub-command lives in its own module of this package and is registered here.
Exit codes: 0 success, 1 a reported problem (analysis or rewrite failed, a check failed),
2 bad usage (click's own).
"""

from __future__ import annotations

import importlib

import click

# module name in tilelink.cli -> attribute holding the click command
_COMMANDS = {
    "build_cmd": ("build", "show", "check"),
    "mapping_cmd": ("mapping",),
    "run_cmd": ("run",),
    "bench_cmd": ("bench",),
}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="tilelink")
def main() -> None:
    """TileLink: compute-communication overlapped Triton kernels from plain annotated kernels."""


for _module, _names in _COMMANDS.items():
    _mod = importlib.import_module(f"tilelink.cli.{_module}")
    for _name in _names:
        main.add_command(getattr(_mod, _name))


if __name__ == "__main__":
    main()
