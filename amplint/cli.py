"""The command line: thin wrappers that parse options and hand off."""

from __future__ import annotations

import click

from . import __version__
from .probe.command import probe


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="amplint")
def main():
    """amplint: find and fix automatic-mixed-precision mistakes in PyTorch code."""


main.add_command(probe)
