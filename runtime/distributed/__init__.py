"""``serve --distributed``: group join and sharding (:mod:`mlxrt.distributed.serving`), the
lockstep protocol between ranks, and ``mlxrt launch`` over mlx.launch (docs/distributed.md)."""
