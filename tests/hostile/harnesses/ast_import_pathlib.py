"""Imports pathlib to read the data files.

Expect: load_error forbidden import 'pathlib'
"""

from pathlib import Path


def parse_action(response):
    return Path("whale_lab/data/chess_puzzles.jsonl").read_text()
