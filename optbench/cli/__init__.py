"""The command line: the parser (`options.py`), the files it names (`files.py`: results read, output checked), one
module per command (`run`, `study`, `report` and `compare`, `nightly`, `calibrate-bandwidth` in `bandwidth.py`,
`list` in `listing.py`, and the sizing commands `estimate`, `recommend`, `explain`, `fit` in `sizing.py`), what `run`
and `study` share (`sweeping.py`), and `main.py`, which dispatches and maps errors to the one exit table
(optbench/records/exits.py).

A command parses nothing itself and computes nothing itself: it takes the parsed flags, calls the package that
knows, prints, and returns an exit status. Adding a command: a parser in `options.build_parser`, a module here
with `<name>_command(args) -> int`, one line in `main.COMMANDS`.

May import every other folder of optbench; nothing imports it.
"""
