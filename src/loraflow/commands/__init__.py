"""The `loraflow` command (cli.py) and the commands that are not training: generate/chat, merge, plot.
(check, explain and probe live in frontends/, explain/ and probes/, which the CLI calls.)"""
