"""``tvm-roller serve``: an OpenAI-compatible HTTP server over a compiled causal LM (the
``[serve]`` extra: FastAPI, uvicorn, prometheus_client).

``runner`` (compile, then uvicorn) over ``app`` (routes, validation, SSE) over ``worker`` (the
engine loop: one sequence at a time) over ``engine`` (the bounded queue, jobs and their events)
and ``responses`` (OpenAI's response objects) over ``schemas`` (request bodies, errors) and
``metrics`` (Prometheus). Nothing is imported here: ``tvm-roller --help`` needs none of it.
"""
