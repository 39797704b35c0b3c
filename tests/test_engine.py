"""The embedded engine with the real bundled Whisper tiny.en weights."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from realtime.engines import EngineError, TranscribeOptions
from realtime.engines.embedded import EmbeddedEngine, resolve_model

from speech import SENTENCES, sentence_audio, wer


def padded(a: np.ndarray, seconds: float = 0.3) -> np.ndarray:
    pad = np.zeros(int(seconds * 16000), dtype=np.float32)
    return np.concatenate([pad, a, pad])


@pytest.fixture(scope="module")
def clips(speech_dir):
    cache = speech_dir / ".speech-cache"
    cache.mkdir(exist_ok=True)
    return [padded(sentence_audio(t, cache)) for t in SENTENCES]


def test_wer_on_synthesized_sentences(engine, clips):
    hyps = [engine.transcribe_sync(c, TranscribeOptions()).text for c in clips]
    score = wer(" ".join(SENTENCES), " ".join(hyps))
    print(f"\nembedded tiny.en int8 WER {score:.3f}")
    assert score <= 0.15, list(zip(SENTENCES, hyps, strict=True))


def test_partial_options_transcribe_too(engine, clips):
    result = engine.transcribe_sync(clips[0], TranscribeOptions(partial=True))
    assert wer(SENTENCES[0], result.text) <= 0.3
    assert result.duration == pytest.approx(clips[0].size / 16000)


def test_batch_keeps_each_clip_its_own_text(engine, clips):
    batch = asyncio.run(engine.transcribe_batch(clips[:4], [TranscribeOptions()] * 4))
    for i, result in enumerate(batch):
        assert not isinstance(result, BaseException)
        assert wer(SENTENCES[i], result.text) <= 0.3
        others = [wer(SENTENCES[j], result.text) for j in range(4) if j != i]
        assert min(others) > wer(SENTENCES[i], result.text)


@pytest.mark.parametrize("kind", ["silence", "white-noise", "loud-noise", "hum", "brown-noise"])
def test_silence_and_noise_give_empty_text(engine, kind):
    rng = np.random.default_rng(0)
    n = 16000 * 3
    audio = {
        "silence": np.zeros(n),
        "white-noise": 0.05 * rng.standard_normal(n),
        "loud-noise": 0.3 * rng.standard_normal(n),
        "hum": 0.1 * np.sin(2 * np.pi * 120 * np.arange(n) / 16000),
        "brown-noise": 0.02 * np.cumsum(rng.standard_normal(n)) / 30,
    }[kind].astype(np.float32)
    assert engine.transcribe_sync(audio, TranscribeOptions()).text == ""
    assert engine.transcribe_sync(audio, TranscribeOptions(partial=True)).text == ""


def test_long_clip_and_timestamps_use_long_form(engine, clips):
    audio = np.concatenate(clips[:6] * 2)  # over 30 s
    assert audio.size > 30 * 16000
    result = engine.transcribe_sync(audio, TranscribeOptions(timestamps=True))
    assert len(result.segments) >= 2
    assert all(s.end >= s.start for s in result.segments)
    assert wer(" ".join(SENTENCES[:6] * 2), result.text) <= 0.2
    # the temperature a timed decode ended at, which the file path reads to decode a sampled window's segments alone
    # (realtime/live/coverage.py `sampled`): without it a sampled timed window was trusted, loops and all
    assert result.extra["temperature"] == 0.0
    window = np.concatenate(clips[:3])
    sampled = engine.transcribe_sync(window, TranscribeOptions(timestamps=True, temperature=0.4))
    assert sampled.extra["temperature"] == 0.4


def test_a_decode_asked_without_fallback_is_rejected_where_it_would_have_fallen_back(engine):
    """Real clips played backwards, whose greedy decode the policy rejects, and the same clips forwards: asked
    without fallback (a packed window, realtime/live/coverage.py), the text and timed decodes are marked rejected
    exactly where, asked with it, they go on to sample at a higher temperature."""
    from realtime.audio import decode_file
    from realtime.engines import policy

    from real_speech import clips as real_clips

    names = ("timit-LDC93S1.flac", "ljspeech-LJ002-0020.flac")
    picked = {c.name: decode_file(c.path) for c in real_clips() if c.name in names}
    assert len(picked) == len(names)
    seen = set()
    for name, audio in picked.items():
        for clip in (audio, audio[::-1].copy()):
            for timed in (False, True):
                fell_back = policy.rejected(engine.transcribe_sync(clip, TranscribeOptions(timestamps=timed)))
                alone = engine.transcribe_sync(clip, TranscribeOptions(timestamps=timed, fallback=False))
                assert policy.rejected(alone) == fell_back, (name, timed)
                assert not alone.extra["temperature"]
                seen.add(fell_back)
    assert seen == {True, False}


def test_a_timed_decode_checked_for_coverage_gains_words_without_changing_its_pieces(engine):
    """The file path checks a timed window by its words too (realtime/live/coverage.py): they are aligned on the
    decode's own encoder output afterwards, so that the pieces are Whisper's timestamps as decoded without words
    (asking faster-whisper for words moves where its long-form decoding seeks)."""
    from realtime.audio import decode_file

    from real_speech import clips as real_clips

    audio = np.concatenate([decode_file(c.path) for c in real_clips()
                            if c.name in ("jfk.flac", "ljspeech-LJ002-0020.flac")])
    plain = engine.transcribe_sync(audio, TranscribeOptions(timestamps=True))
    checked = engine.transcribe_sync(audio, TranscribeOptions(timestamps=True, word_timestamps=True, coverage=True))
    assert [(p.start, p.end, p.text) for p in checked.segments] == [(p.start, p.end, p.text) for p in plain.segments]
    assert not plain.words and len(checked.words) == len(checked.text.split())
    # a piece's last word may run on into the pause after it (0.52 s with the int8 kernels of an Intel CPU with AMX)
    assert all(p.start - 1.0 <= w.start <= w.end <= p.end + 1.0 for p in checked.segments for w in p.words)


def test_bad_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(EngineError, match=r"model\.bin"):
        EmbeddedEngine(model=str(tmp_path))
    assert resolve_model("distil-whisper/distil-large-v3.5") == ("distil-whisper/distil-large-v3.5",) * 2
    assert resolve_model(None)[1] == "tiny.en (bundled)"


def test_bad_input_raises_engine_error(engine):
    with pytest.raises(EngineError):
        engine.transcribe_sync(np.ones((3, 3, 3), dtype=np.float32), TranscribeOptions())


def test_batches_split_between_the_two_workers_by_padded_work(engine):
    from realtime.engines.embedded import _split

    # two CTranslate2 workers where there are two cores or more, else one
    assert engine.workers == (2 if (os.cpu_count() or 1) >= 2 else 1)
    assert _split([16000, 16000, 16000, 160000], [7, 8, 9, 10]) == ([7, 8, 9], [10])
    assert _split([5, 1, 4, 2], [0, 1, 2, 3]) == ([1, 3], [2, 0])
    first, second = _split([3] * 8, list(range(8)))
    assert sorted(first + second) == list(range(8)) and len(first) == len(second) == 4


def test_token_logprobs_spell_the_text_and_add_up_to_the_decode_s_score(engine):
    """Issue 41: with `logprobs` asked, every text token comes back with the log-softmax of its step's logits, on
    each decoding path (packed or a clip alone, a partial, a sampled retry, Whisper's timestamps): in order they
    spell the text byte for byte, each word holds its own tokens, and on a decode without timestamps they add up
    to the decode's own cumulative score (`avg_logprob` times tokens plus one, as faster-whisper reckons it), less
    the end-of-text token's log probability, which is not text and is near 0 where a sentence plainly ends."""
    from realtime.audio import decode_file

    from real_speech import DATA

    asked = [TranscribeOptions(logprobs=True), TranscribeOptions(logprobs=True, word_timestamps=True),
             TranscribeOptions(logprobs=True, partial=True), TranscribeOptions(logprobs=True, temperature=0.4),
             TranscribeOptions(logprobs=True, timestamps=True, word_timestamps=True)]
    for name in ("jfk.flac", "ljspeech-LJ001-0004.flac"):
        audio = decode_file(DATA / name)
        plain = engine.transcribe_sync(audio, TranscribeOptions())
        assert plain.logprobs is None, "asked for nothing, given nothing"
        for options in asked:
            result = engine.transcribe_sync(audio, options)
            tokens = result.logprobs
            assert tokens and all(t.logprob <= 0.0 and t.token == bytes(t.bytes).decode() for t in tokens), name
            assert b"".join(bytes(t.bytes) for t in tokens).decode().strip() == result.text, (name, options)
            for w in result.words:
                assert b"".join(bytes(t.bytes) for t in w.logprobs).decode().strip() == w.word.strip(), (name, w)
            if not options.timestamps:
                cumulative = result.avg_logprob * (len(tokens) + 1)
                assert 0.0 <= sum(t.logprob for t in tokens) - cumulative < 0.3, (name, options)
        assert engine.transcribe_sync(audio, TranscribeOptions(logprobs=True)).text == plain.text
    assert engine.transcribe_sync(np.zeros(16000, np.float32), TranscribeOptions(logprobs=True)).logprobs == ()
