"""The web faces: everything a browser or a client speaks to, built on the live pipeline.

Owns the server and the page (`server`, `ui`, `handler`), OpenAI's HTTP transcription API (`api`, its fields in
`api_fields`) and Realtime API (`realtime_api`), WebRTC signalling, TURN and ICE (`signalling`, `turn`, `ice`), the
demo limits (`limits`), who may read a transcript (`access`), shutdown and metrics.

May import the live pipeline, the speaker model, the engines and the ground, nothing above.
"""
