"""Test speech: re-exports realtime.bench.synth (synthesized sentences with known text and boundaries, WER)."""

from realtime.bench.synth import RATE, SENTENCES, Speech, compose, long_recording, sentence_audio, wer

__all__ = ["RATE", "SENTENCES", "Speech", "compose", "long_recording", "sentence_audio", "wer"]
