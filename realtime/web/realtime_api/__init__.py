"""OpenAI's Realtime API for transcription sessions: `GET /v1/realtime` upgraded to a WebSocket.

This module owns the WebSocket route and the translation between OpenAI's realtime events (the shapes of the
openai SDK's `openai.types.realtime`) and the app's live pipeline. Each connection is one
`TranscriptionSession` of the shared `TranscriptionService` (the page's sessions, same engine, worker and
batching); nothing here transcribes by itself.

Client events: `session.update` (a session of `type` `transcription`, or the beta API's
`transcription_session.update`, answered with `transcription_session.updated`: `audio.input.format` `audio/pcm` at
24 kHz, `audio/pcmu` or `audio/pcma` at 8 kHz; `audio.input.transcription` `model`, `language`, `prompt`;
`audio.input.turn_detection` `server_vad` with `threshold`, `prefix_padding_ms`, `silence_duration_ms`,
`semantic_vad` with `eagerness` (the end-of-turn model judges each pause: realtime/live/end_of_turn.py), or `null`
for manual commits; `noise_reduction` `near_field` or `far_field` denoises what the session's VAD hears
(realtime/live/denoise.py), the engine reading the audio as it came; `include`
`["item.input_audio_transcription.logprobs"]` puts each token's log probability on the deltas and the
completed event, on engines that give them, and is refused with an `error` on others),
`input_audio_buffer.append` (base64 audio), `.commit`, `.clear`.

Server events: `session.created` (first), `session.updated`, `input_audio_buffer.speech_started`,
`.speech_stopped`, `.committed`, `.cleared`, `conversation.item.input_audio_transcription.delta` (append-only:
the words LocalAgreement has committed, as they settle, then the rest of the final text; their concatenation
is the `.completed` transcript, as the concatenation of their `logprobs` is its `logprobs`), `.completed` (with
`usage` in seconds of audio), `.failed` (the engine failed on
that item), and `error` for a bad, unknown, oversized or malformed event (the session goes on).

With server VAD the session's own VAD cuts items and deltas flow while the person speaks. With
`turn_detection: null` the audio is buffered here (at most `MANUAL_MAX_S`) and `commit` sends it to the
shared worker as one final; the session's segmenter still hears it, so the demo limits (idle, stale audio)
judge the session as they judge the page's.

Authentication (`--api-key`): `Authorization: Bearer <key>`, the subprotocol form the SDKs use in browsers
(`openai-insecure-api-key.<key>`), or an ephemeral secret from `POST /v1/realtime/client_secrets`; anything
else is refused with 401 before the WebSocket is accepted. Sessions count against `--concurrency-limit`
(refused with 503 when the live sessions, the page's included, reach it).

Per client address (realtime/web/signalling.py's `ClientLimiter`, the page's rules: `--max-connections-per-client`,
`--max-new-connections-per-minute`, `--client-ip-header`), the WebSocket and `POST /v1/realtime/calls` share a cap
on open sessions and on new ones per minute, counted apart from the page's WebRTC connections; a session's slot is
freed when it closes (a call's on hangup or when its peer connection ends). Minting client secrets has the
per-minute cap of its own. Over a cap is a 429 with Retry-After and OpenAI's error shape (`rate_limit_error`),
for the WebSocket before it is accepted, and before the key is checked (a refused attempt spends no secret).

A `language` the engine's model does not know (any but `en` on an English-only model) is an `error` with code
`unsupported_language` (400 on the HTTP routes) and the session keeps its language.
"""

from .routes import create_realtime_router

__all__ = ["create_realtime_router"]
