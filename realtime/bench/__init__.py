"""Benchmarks, side by side in one run: file RTFx/WER against peers, live latency under load, quantization.

    python -m realtime bench file   [--audio FILE --text REF | --audio MANIFEST.tsv [--joined PAUSE_S]] [--model base]
    python -m realtime bench file   --random N [--seed S] [--served]  (bench/compilations.py: speech lost on random
                                    compilations of a manifest's clips)
    python -m realtime bench stream [--audio FILE --text REFERENCE | --audio MANIFEST.tsv] [--clients 1,2,4,8,16]
    python -m realtime bench quant  [--audio MANIFEST.tsv] [--vllm base]
    python -m realtime bench soak   --minutes M --clients N [--audio FILE --text REFERENCE] [--url URL --pid PID]
    python -m realtime bench pool   [--autoscale 1:3] [--clients 1,2,4,8] [--beside-embedded]  (bench/pool.py)
    python -m realtime bench gpu    [--model M] [--concurrency 1,16,64]  (bench/gpu.py: an NVIDIA GPU)
    python -m realtime bench speakers [--dir tests/data/speakers] [--conversations N --seed S]  (bench/speakers.py:
                                    DER and speaker count against RTTM references, and on constructed conversations)
    python -m realtime bench peers  [--clients 1,4,8] [--systems ...]  (bench/peers.py: WhisperLive, WhisperLiveKit)
    python -m realtime bench turns  [--modes silence,high,medium] [--clients 1,8]  (bench/turns.py: end of turn)
    python -m realtime bench vocabulary [--models tiny.en,base]  (bench/vocabulary.py: rare names, with and without)

All take --out DIR. A manifest is tests/data/manifest.tsv's format: real clips with their reference texts.

Each writes DIR/bench-<kind>.json, a Markdown table DIR/bench-<kind>.md and a chart DIR/bench-<kind>.png.
Speed is reported as medians over several runs after a warm-up, and as ratios measured in the same run.
One module per benchmark (files, compilations, stream, soak, quant, pool, gpu, speakers, peers, turns, vocabulary),
what they share in common.py, the command line in cli.py; corpus.py (real clips, random compilations of them, WER and
lost speech), conversations.py (real voices taking turns, with a speaker reference), synth.py (synthesized speech)
and client.py (the WebRTC client) serve them and the tests.
Needs espeak-ng and sox (synthesized speech), jiwer and whisper-normalizer (WER), matplotlib (charts).
"""
