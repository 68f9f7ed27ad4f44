"""The run and its directory: which config a run starts from, the directory's lifecycle, logging, the process
group, failures, the disk, stop signals, and `build_run`, which assembles config -> plan -> data -> model -> trainer."""
