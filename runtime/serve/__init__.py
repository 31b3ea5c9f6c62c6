"""`runtime serve`: one bound engine behind HTTP (FastAPI on uvicorn), one process, one engine thread.

app.py routes, schemas.py request/response bodies, http_errors.py the error bodies and
status codes, metrics.py Prometheus metrics, state.py the engine's serving state,
server.py the uvicorn server with its SIGTERM drain. Imported only by `runtime serve`.
"""
