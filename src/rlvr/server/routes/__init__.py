"""The ``/api/v1`` routes of ``rlvr serve``, one ``APIRouter`` per concern; ``app.create_app`` includes them in this
order (a request goes to the first route that matches it):

- ``sessions``: health, ``client/config``, capabilities, telemetry, sessions and their heartbeats;
- ``training``: create a model, ``get_info``, ``forward_backward``, ``optim_step``, save and load weights;
- ``sampling``: sampling sessions, samplers, ``asample``;
- ``futures``: ``retrieve_future`` (the SDK's long poll for every queued result) and ``cancel_future``;
- ``rest``: what the SDK's ``RestClient`` calls (training runs, checkpoints, downloads, session listing);
- ``sessions.unserved``, last: the SDK calls ``client/config`` switches off, and the 404 for every other path.

Each handler is a module-level async function of plain values, the raw body, the caller's key (``Owner``) and the
``RouteContext`` (``context.py``), so a test may call it without HTTP.

Not here: the app itself, its middleware and error statuses (``app.py``), the OpenAI-compatible ``/v1`` routes
(``openai.py``), the hub-shaped ``/hf`` routes (``hub.py``), body formats (``wire.py``), sessions and ordering
(``state.py``).
"""
