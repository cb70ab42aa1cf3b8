"""One module per `octopipe` subcommand; `cli.py` finds them here by name."""
