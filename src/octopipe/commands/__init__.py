"""One module per `octopipe` subcommand; `cli.py` finds them here by name (a module whose
name starts with `_` is a helper of one, not a command)."""
