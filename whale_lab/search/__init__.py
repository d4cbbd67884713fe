"""The harness phase: Meta-Harness search over an on-disk archive, with proposers and a review gate.

Import the parts you need (`archive`, `meta_harness`, `proposers`, ...); this package module stays
light so that the TUI can read archives without loading models.
"""
