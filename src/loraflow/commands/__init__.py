"""The `loraflow` command (cli.py) and the commands that are not training: generate/chat, merge, plot.
check.py holds `loraflow check`'s flags and exit codes; what it checks lives in frontends/ and plan/, as explain's and
probe's work lives in explain/ and probes/."""
