"""The ``servesim`` command line: thin click commands that parse, call the API and format."""

from __future__ import annotations

import sys

import click

from servesim import __version__
from servesim.errors import ServesimError


class _Group(click.Group):
    """Turns :class:`ServesimError` into a one-line message and exit status 2, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ServesimError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="servesim")
def main() -> None:
    """servesim: plan LLM serving capacity from GPU specification sheets.

    Predicts time to first token, time per output token, throughput and cost of serving a model with vLLM or
    SGLang on GPUs you may never have profiled.
    """


#: Modules of ``servesim.cli`` that each export ``COMMANDS``, a list of click commands. Heavy imports (pandas,
#: scikit-learn) stay inside the command functions so that ``servesim --help`` is quick.
_COMMAND_MODULES = ("plan", "catalog", "kernels", "comm", "workloads", "serving", "estimator", "validate", "collect")


def _register() -> None:
    import importlib

    for module_name in _COMMAND_MODULES:
        module = importlib.import_module(f"servesim.cli.{module_name}")
        for command in module.COMMANDS:
            main.add_command(command)
    from servesim.cli.comm import eval_group, kernel_group
    from servesim.cli.estimator import EVAL_SUBCOMMANDS
    from servesim.cli.kernel_explain import SUBCOMMANDS

    for command in SUBCOMMANDS:
        kernel_group.add_command(command)
    for command in EVAL_SUBCOMMANDS:
        eval_group.add_command(command)


_register()
