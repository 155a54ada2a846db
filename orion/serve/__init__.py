"""`orion serve`: an OpenAI-compatible HTTP server for one model on one device.

    app.py       routes, errors, auth (starlette; uvicorn serves it)
    requests.py  the request fields, checked
    worker.py    the model's thread and its bounded queue
    registry.py  what a request's `model` names (the base; adapters later)
    errors.py    OpenAI-style error bodies

Needs the `serve` extra (starlette, uvicorn, sse-starlette). docs/serve.md has the
commands and the security notes.
"""
