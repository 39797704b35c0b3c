"""The live pipeline: audio in, speech segments, jobs for the engine, transcript events out.

Owns the VAD and its segmenter (`vad`), a live session with its partials and LocalAgreement (`session`,
`stabilize`), the one worker whose lanes every request goes through (`worker`), the file path with its coverage rule
(`transcribe`, `coverage`), the events and the transcript's formats (`events`, `transcript`), speaker labels on
entries (`labels`), the service that ties them to one engine (`service`) and memory given back when the queue
empties (`memory`).

May import the speaker model, the engines and the ground (`realtime.audio`, `realtime.config`), nothing above.
"""
