"""Every GPU of a node and of a cluster, on Dask distributed: a model's kernels tuned at once,
each kernel's run in a worktree of its own, a step's candidates judged and timed on several
GPUs at once. The driver (the process that holds the repository) alone decides, commits and
writes each record; workers measure and return data (docs/fleet.md)."""
