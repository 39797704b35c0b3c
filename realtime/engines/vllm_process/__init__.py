"""The vLLM engine's own process (`service.py`), run by `VllmEngine` with the vLLM environment's interpreter.

It lives in a folder of its own because it runs as a script: the folder of a script comes first on its `sys.path`,
and beside the engines' modules (`vllm.py`, `types.py`) it would import them instead of vLLM and the standard
library. Nothing in it imports the app.
"""
