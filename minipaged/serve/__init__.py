"""The OpenAI-compatible server over the engine, its engine loop and the projector page.

``python -m minipaged serve`` (:mod:`minipaged.serve.cli`) starts it;
:func:`minipaged.serve.app.create_app` builds the application around an ``LLM``. The server's
libraries (FastAPI, uvicorn, prometheus_client, jinja2) come with ``pip install -e ".[serve]"``. One module per idea:

- :mod:`~minipaged.serve.app`: the FastAPI application, its routes and error handlers;
- :mod:`~minipaged.serve.completions`: the completion endpoints, streaming included;
- :mod:`~minipaged.serve.protocol`: the OpenAI wire format (pydantic request models, responses, errors);
- :mod:`~minipaged.serve.inputs`: requests -> engine inputs, checked against the engine's limits;
- :mod:`~minipaged.serve.engine_loop`: the one thread that owns and steps the engine;
- :mod:`~minipaged.serve.deltas`: how much streamed text may be sent yet;
- :mod:`~minipaged.serve.live` and :mod:`~minipaged.serve.projector`: the page's frames and figures;
- :mod:`~minipaged.serve.limits` and :mod:`~minipaged.serve.access`: caps, admission, the join code;
- chat templates live in :mod:`minipaged.model.chat_template`; :mod:`~minipaged.serve.metrics`: ``/metrics``;
- ``static/``: the pages (HTML, JavaScript, CSS; no build step).

The server is an adapter over the engine's step API (``add_request``, ``step``,
``abort_request``, ``kv_stats``), not a second engine. Nothing in the core imports it.
"""
