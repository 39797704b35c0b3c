"""Silero's place taken by recorded probabilities: the segmenter's rules, and what a session does with them, alone."""

from __future__ import annotations

import numpy as np


class Replay:
    """A VAD model that answers each 512-sample window with the next of these probabilities."""

    def __init__(self, probabilities: list[float]) -> None:
        self.answers = iter(probabilities)

    def new_state(self) -> None:
        return None

    def probabilities(self, windows: np.ndarray, state: None) -> np.ndarray:
        return np.array([next(self.answers) for _ in windows])
