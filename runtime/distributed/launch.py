"""``mlxrt launch``: start ``mlxrt serve --distributed`` on every host through ``mlx.launch``.

A thin wrapper: it builds mlx.launch's command line (hosts, backend, ring ports) and runs
it, so the ranks get exactly what mlx.launch gives any MLX program (``MLX_RANK``,
``MLX_HOSTFILE``, ssh to remote hosts, output of every rank on this terminal, and all ranks
stopped when one fails); and :func:`launched_as_rank`, whether this process is such a rank. Kept
apart from :mod:`mlxrt.distributed.serving` so that the command line, and a start that is not
distributed, load without importing the engine and the distributed group.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import click

from mlxrt.compat import MLX_LAUNCH_CODE

__all__ = ["register", "launch_command", "launched_as_rank"]


def launched_as_rank(environ: Any = None) -> bool:
    """Whether this process was started as one rank of several (by mlx.launch for the ring
    backend, or by mpirun): then ``mlxrt serve`` serves distributed even without
    ``--distributed``, as mlx_lm.server does."""
    env = os.environ if environ is None else environ
    if env.get("MLX_RANK") is not None and env.get("MLX_HOSTFILE"):
        return True
    try:
        return int(env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE") or 1) > 1
    except ValueError:
        return False


def launch_command(serve_args: Sequence[str], *, hosts: str | None, hostfile: str | None, backend: str | None,
                   starting_port: int, python: str, verbose: bool = False) -> list[str]:
    """The ``mlx.launch`` argv that runs ``mlxrt serve --distributed SERVE_ARGS`` on each host.

    :raises click.UsageError: ``serve_args`` does not start with ``serve``.
    """
    args = list(serve_args)
    if args[:1] == ["--"]:
        args = args[1:]
    if args[:1] != ["serve"]:
        raise click.UsageError("give the serve command after --: mlxrt launch --hosts h1,h2 -- serve MODEL ...")
    if "--distributed" not in args:
        args.insert(1, "--distributed")
    where = ["--hostfile", hostfile] if hostfile else ["--hosts", hosts or "127.0.0.1,127.0.0.1"]
    # The same interpreter path on every host (as mlx.launch assumes for its own --python).
    # Without --backend, mlx.launch takes the hostfile's, else ring (nccl with CUDA).
    return [python, "-c", MLX_LAUNCH_CODE, *where,
            *(["--backend", backend] if backend else []), "--starting-port", str(starting_port), *(["--verbose"] if verbose else []),
            "--", python, "-m", "mlxrt.cli", *args]


def register(cli: click.Group) -> None:
    """Add ``mlxrt launch`` to ``cli``."""

    @cli.command("launch", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
    @click.option("--hosts", default=None,
                  help="Comma-separated IPs, one per rank, rank 0 first (default: 127.0.0.1 twice).")
    @click.option("--hostfile", default=None, type=click.Path(dir_okay=False, exists=True),
                  help="mlx.launch hostfile (JSON) instead of --hosts.")
    @click.option("--backend", type=click.Choice(["ring", "mpi", "jaccl", "nccl"]), default=None,
                  help="mlx.distributed backend (default: the hostfile's, else mlx.launch's: ring on CPU/Metal).")
    @click.option("--starting-port", type=click.IntRange(1, 65535), default=32323, show_default=True,
                  help="Ring backend: rank r listens on this port + r (one port per rank and IP).")
    @click.option("--python", default=sys.executable, show_default=True,
                  help="Interpreter with mlxrt installed, at this path on every host.")
    @click.option("--verbose", is_flag=True, help="mlx.launch's debug output.")
    @click.option("--dry-run", is_flag=True, help="Print the mlx.launch command instead of running it.")
    @click.argument("serve_args", nargs=-1, type=click.UNPROCESSED)
    def launch(serve_args: tuple[str, ...], hosts: str | None, hostfile: str | None, backend: str | None,
               starting_port: int, python: str, verbose: bool, dry_run: bool) -> None:
        """Run `mlxrt serve --distributed …` on every host with mlx.launch.

        Example: mlxrt launch --hosts 10.0.0.1,10.0.0.2 -- serve MODEL --host 0.0.0.0 --api-key K
        """
        argv = launch_command(serve_args, hosts=hosts, hostfile=hostfile, backend=backend,
                              starting_port=starting_port, python=python, verbose=verbose)
        if dry_run:
            import shlex

            click.echo(shlex.join(argv))
            return
        sys.exit(subprocess.call(argv))
