"""The `whale-lab` sub-commands, one module each, so every entry point lives in one place.

`whale_lab.cli` parses the arguments and imports the module of the command it runs (and only
that one, so `whale-lab --help` stays fast). Each module turns a parsed command into calls on the
library (engine, RSFT, search, evaluation, calibration), prints what a user reads and returns the
process exit code. Nothing here imports the TUI; the CLI opens it itself.

- `run`: `whale-lab run --headless` and `whale-lab resume --headless`
- `eval`, `train`, `search`, `probe`, `compare`: the commands of those names
- `micro`: `whale-lab micro pretrain` and `whale-lab micro calibrate`
- `common`: exit codes, the one-line error rule, the event display and the engine driver
"""
