"""The ``dlscale`` entry point: the command tree and one place that turns errors into exit codes.

Errors print one line on stderr (``error: ...``) and exit 2 for bad input, 1 for a failed run
(and for a finished one whose record had to be kept in the local spool: ``stores.spool``);
``DLSCALE_DEBUG=1`` adds the traceback. Nothing here imports torch: ``--help`` stays fast.
"""

from __future__ import annotations

import os
import sys
import traceback

import click
import typer

try:  # typer >= 0.2x carries its own copy of click; older ones use click itself
    from typer._click import exceptions as _tx
except ImportError:  # pragma: no cover - depends on the typer version installed
    import click.exceptions as _tx

from dlscale.errors import EXIT_FAILURE, EXIT_USAGE, DlscaleError

app = typer.Typer(
    name="dlscale",
    help="Measure, explain and predict deep-learning training performance on a machine, a server and a cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        from dlscale import __version__

        print(f"dlscale {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", help="Print the version and exit.", is_eager=True,
                                 callback=_print_version),
) -> None:
    """Measure, explain and predict deep-learning training performance on a machine, a server and a cluster."""


def _register() -> None:
    from dlscale.cli import models, results, sysinfo, train

    app.command("train", help=train.HELP, epilog=train.EPILOG)(train.train)
    app.command("sysinfo", help=sysinfo.HELP)(sysinfo.sysinfo)
    app.command("models", help=models.HELP)(models.models)
    app.add_typer(results.app, name="results")
    from dlscale.cli import scale

    app.command("scale", help=scale.HELP, epilog=scale.EPILOG)(scale.scale)
    from dlscale.cli import micro

    app.add_typer(micro.app, name="micro", help=micro.HELP, epilog=micro.EPILOG)
    from dlscale.cli import data, dataset

    app.add_typer(dataset.app, name="dataset")
    app.command("data", help=data.HELP, epilog=data.EPILOG)(data.data)
    from dlscale.cli import sweep

    app.command("sweep", help=sweep.HELP, epilog=sweep.EPILOG)(sweep.sweep)
    from dlscale.cli import compare, importcmd, report

    app.command("import", help=importcmd.HELP, epilog=importcmd.EPILOG)(importcmd.import_)
    app.command("compare", help=compare.HELP, epilog=compare.EPILOG)(compare.compare)
    app.command("report", help=report.HELP, epilog=report.EPILOG)(report.report)
    from dlscale.cli import tta

    app.command("tta", help=tta.HELP, epilog=tta.EPILOG)(tta.tta)
    from dlscale.cli import predict

    app.command("predict", help=predict.HELP, epilog=predict.EPILOG)(predict.predict)
    from dlscale.cli import infer

    app.command("infer", help=infer.HELP, epilog=infer.EPILOG)(infer.infer)
    from dlscale.cli import tune

    app.command("tune", help=tune.HELP, epilog=tune.EPILOG)(tune.tune)
    from dlscale.cli import accept

    app.command("accept", help=accept.HELP, epilog=accept.EPILOG)(accept.accept)
    from dlscale.cli import serve

    app.command("serve-bench", help=serve.HELP, epilog=serve.EPILOG)(serve.serve_bench)
    from dlscale.cli import cluster

    app.add_typer(cluster.app, name="cluster", help="A Slurm cluster of K nodes on this machine, to rehearse a "
                                                   "cluster run: `dlscale cluster up`, `dlscale cluster down`.")
    dataset.app.command("digits", help=tta.DIGITS_HELP)(tta.digits)


_register()


def _one_line(msg: str) -> str:
    return " ".join(str(msg).split())


def main(argv: list[str] | None = None) -> None:
    from dlscale import importguard

    importguard.install()  # a Ctrl-C during torch's first import is delivered after it, not lost
    debug = bool(os.environ.get("DLSCALE_DEBUG"))
    command = typer.main.get_command(app)
    from dlscale.cli.badinput import guard_numbers

    guard_numbers(command)  # every int/float option: finite, within limits.INTEGER (limits.number)
    code = 0
    try:
        rv = command.main(args=argv, prog_name="dlscale", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
        if code == 130:  # typer returns Ctrl-C as 130
            code = _interrupted()
    except (_tx.NoArgsIsHelpError, click.exceptions.NoArgsIsHelpError):
        code = 0  # the help was printed already
    except (typer.Exit, click.exceptions.Exit) as e:
        code = e.exit_code
    except (typer.Abort, click.exceptions.Abort):
        print("error: aborted", file=sys.stderr)
        code = 130
    except (_tx.ClickException, click.ClickException) as e:  # bad options, missing arguments
        if debug:
            traceback.print_exc()
        from dlscale.cli.badinput import message

        print(f"error: {_one_line(message(e))}", file=sys.stderr)
        code = EXIT_USAGE if e.exit_code == 2 else e.exit_code
    except DlscaleError as e:
        if debug:
            traceback.print_exc()
        print(f"error: {_one_line(str(e))}", file=sys.stderr)
        code = e.exit_code
    except KeyboardInterrupt:
        code = _interrupted()
    except BrokenPipeError:
        code = 0
    except Exception as e:  # noqa: BLE001 - the last resort: still one line
        if debug:
            traceback.print_exc()
        print(f"error: internal error: {type(e).__name__}: {_one_line(str(e))[:300]} "
              "(set DLSCALE_DEBUG=1 for the traceback)", file=sys.stderr)
        code = EXIT_FAILURE
    sys.exit(_spooled(code))


def _interrupted() -> int:
    """Ctrl-C: one line saying what the command kept and how to go on, where it said (``errors.on_interrupt``); 130."""
    from dlscale.errors import take_interrupt_note

    note = take_interrupt_note()
    print(f"error: interrupted{': ' + _one_line(note) if note else ''}", file=sys.stderr)
    return 130


def _spooled(code: int) -> int:
    """A record kept in the local spool (its database stayed away) was not delivered: say where it
    is and how to deliver it, and exit 1 although its figures were printed."""
    from dlscale.stores import spool

    kept = spool.take_pending()
    if not kept:
        return code
    print(f"error: {spool.summary(kept)}", file=sys.stderr)
    return code if code not in (0, EXIT_USAGE) else EXIT_FAILURE


if __name__ == "__main__":
    main()
