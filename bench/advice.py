"""What to change, per group of time, read beside that group's measured share and cost.

The text says what the frames of that group were doing in the profiles of this harness
(which lines are hot, how often per job) and one way to spend less there. It is advice for
whoever owns that code: the benchmark changes nothing in taogpud.
"""

from __future__ import annotations

ADVICE: dict[str, str] = {
    "job store (SQLite)": (
        "The hot lines are the store's commit (a WAL append: a write per frame header and "
        "page) and each record's `model_dump_json`, whose text is also the answer. A submit "
        "that waits is committed once, just before its answer; under load one commit takes "
        "every change of 2 ms. Fewer bytes per record, or a commit after the answer (which "
        "would give up 'stored before it is shown'), are what is left."
    ),
    "logging and traces": (
        "Four JSON lines per tiny job (job.queued, job.running, job.succeeded and api.request). "
        "They are written just after the loop's current callback (observability/trace.py), so the "
        "order and the answer leave first, and each batch goes out in one write; what is "
        "left is rendering them (job_fields, redaction, orjson). Fewer fields, or skipping "
        "`api.request` for `POST /v1/jobs` (the job lines say the same), would shrink it; the "
        "A/B row in section 1 (traces off) is the most this group can give back."
    ),
    "worker pipe": (
        "Per job the daemon pickles an order and writes it to a free slot's pipe, and reads "
        "and unpickles the result (`Connection._send`, `_recv`, `ForkingPickler.dumps`): a "
        "write, two reads and a wake-up of the other process each way, on 2 cores a context "
        "switch each. Plain tuples instead of pickled dataclasses, and one read per message "
        "with our own framing, are what is left."
    ),
    "framework (FastAPI, Starlette, anyio)": (
        "Every request passes FastAPI's own layers (ServerErrorMiddleware, its telemetry and "
        "body-limit wrappers, ExceptionMiddleware, AsyncExitStackMiddleware), the relay's "
        "prefix check and taogpud's one edge (api/edge.py: body limits and the request "
        "trace). `POST /v1/jobs` sits on the app's own router, matched first, on a "
        "DirectRoute: no parameter or dependency machinery. What is left is those layers "
        "themselves, a coroutine and a send wrapper each, and the routes other than submit, "
        "which are matched through their routers' inclusion contexts."
    ),
    "HTTP server (uvicorn, httptools)": (
        "httptools parsing and uvicorn's callbacks around it: the scope, a "
        "`RequestResponseCycle` and an ASGI task per request, job submits included (one "
        "handler per route, on uvicorn's public surface); the head and body of each answer "
        "leave in one write (doors/http.py). What is left is those per-request objects."
    ),
    "event loop (uvloop, in C)": (
        "uvloop's own C code: epoll, socket and pipe reads and writes, running callbacks. For "
        "uploads the body is read by a buffered protocol into one reused buffer and written "
        "to the image with pwrite, so what shows here is mostly the kernel filling fresh "
        "/dev/shm pages; for tiny jobs it grows with the wake-ups per job (the request, the "
        "worker's result, the answer's callback), so fewer tasks and futures per job shrink it."
    ),
    "pydantic (models, JSON)": (
        "Validating the request and the params, building the `JobRecord`, and its one JSON "
        "dump per commit (the answer reuses the stored text). A lighter record type for the "
        "hot path is what is left."
    ),
    "arrays (shared memory)": (
        "An upload is written into a new /dev/shm file with pwrite (`shm.write_at`): the "
        "kernel allocates and fills each page as it goes. The data-path table's no-socket "
        "row is that filling alone, the ceiling for any upload that lands in fresh shared "
        "memory; past it, only pages kept from earlier uploads (a free list of freed images) "
        "would be faster, at the cost of holding memory nobody uses."
    ),
    "worker process: task, backend": (
        "(The workers' shares are mostly their slot threads waiting in the read of their "
        "pipe; their CPU per job is the firmer number.) A job runs on the slot thread that "
        "read it; what is left is `execute` itself (task lookup, params validation, the "
        "backend's slot and clock) and pickling the result."
    ),
    "numpy (arrays)": (
        "In the client, `upload_array(ndarray)` sends the .npy header and then the array's own "
        "memory (no `np.save` copy); numpy shows here only for arrays that are not "
        "C-contiguous, which are copied once."
    ),
    "client (taogpud.client, http.client)": (
        "The client speaks HTTP/1.1 over the socket with httptools (client/http.py): one "
        "send per request, a peek and a read per answer. What is left is building the request "
        "and decoding the JSON answer."
    ),
}
