from octopipe.cli import entry

entry()
