"""Shared helpers of the demo workloads: where data goes, and a tiny "game"."""

import os
import random
import sqlite3
import time
from pathlib import Path


def data_dir(config: str) -> Path:
    """``$P2PNODE_DATA_DIR/data/<config>`` (the job runner sets the variable), created if needed."""
    root = Path(os.environ.get("P2PNODE_DATA_DIR", ".")) / "data" / config
    root.mkdir(parents=True, exist_ok=True)
    return root


def games_db(config: str) -> sqlite3.Connection:
    con = sqlite3.connect(data_dir(config) / "games.db", timeout=30)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE IF NOT EXISTS games (id INTEGER PRIMARY KEY, job TEXT, moves INTEGER, "
                "winner INTEGER, at REAL)")
    return con


def play(rng: random.Random, board_cells: int = 64) -> tuple[int, int]:
    """A random game: (moves, winner); burns a little CPU like a heuristic player would."""
    moves, score = 0, 0
    while moves < board_cells and rng.random() > 0.02:
        score += sum(rng.random() for _ in range(200)) > 100
        moves += 1
    return moves, score % 2


def run_for(seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        yield
