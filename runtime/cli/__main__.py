"""``python -m mlxrt.cli``: what ``mlx.launch`` runs on each host (:mod:`mlxrt.distributed.launch`)."""

from mlxrt.cli import main

main()
