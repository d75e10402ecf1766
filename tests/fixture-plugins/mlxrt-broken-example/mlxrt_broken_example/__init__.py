"""A deliberately broken plugin: importing it raises."""

raise RuntimeError("mlxrt-broken-example is broken on purpose")
