"""What to change, per group of time, read beside that group's measured share and cost.

The text says what the frames of that group were doing in the profiles of this harness
(which lines are hot, how often per job) and one way to spend less there. It is advice for
whoever owns that code: the benchmark changes nothing in taogpud.
"""

from __future__ import annotations

ADVICE: dict[str, str] = {
    "job store (SQLite)": (
        "The hot lines are the store's commit (a WAL append: write syscalls) and each "
        "record's `model_dump_json`. Fewer, larger transactions (every state change of a "
        "loop pass in one, as long as a submit is answered only after its commit) and one "
        "JSON dump per state change, shared by the store, the response and the trace, "
        "shrink it."
    ),
    "logging and traces": (
        "Four JSON lines per tiny job (job.queued, job.running, job.succeeded and api.request), "
        "each through structlog's processors and `BytesLogger.msg`, which writes and flushes "
        "one line at a time (`structlog/_output.py` write is the hot line: a syscall per "
        "line). Buffer the lines and write them once per loop tick; skip `api.request` for "
        "`POST /v1/jobs`, whose job lines already say the same. The A/B row in section 1 "
        "(traces off) is the most this group can give back."
    ),
    "worker pipe": (
        "Per job the daemon pickles an order and writes it to the worker's pipe, and reads "
        "and unpickles the result (`Connection._send`, `_recv`, `ForkingPickler.dumps`): two "
        "syscalls and a wake-up of the other process each way, on 2 cores a context switch "
        "each. Send plain tuples instead of pickled dataclasses, and let a worker with "
        "several finished jobs send them in one write."
    ),
    "framework (FastAPI, Starlette, anyio)": (
        "Each request crosses seven ASGI layers before the handler (ServerErrorMiddleware, "
        "ExceptionTelemetryMiddleware, AppBodyLimitMiddleware, our RequestTrace and BodyLimit, "
        "ExceptionMiddleware, AsyncExitStackMiddleware), then FastAPI's routing and "
        "`solve_dependencies`. Fold RequestTrace and BodyLimit into one pure-ASGI middleware, "
        "and serve the hot route (`POST /v1/jobs`) as a plain Starlette route that validates "
        "the body with one `TypeAdapter.validate_json` (notes: FastAPI costs ~80 µs a request "
        "over Starlette on this kind of host)."
    ),
    "HTTP server (uvicorn, httptools)": (
        "Mostly `RequestResponseCycle.send` writing the response (a socket write per "
        "response) and httptools parsing: little to win here short of fewer requests."
    ),
    "event loop (uvloop, in C)": (
        "uvloop's own C code: epoll, socket and pipe reads, running callbacks. For uploads it "
        "is reading the body into a new bytes object per chunk (which `_Chunks._put` then "
        "copies again); for tiny jobs it grows with the wake-ups per job (the request, the "
        "worker's result, the waiter's Event), so fewer tasks and futures per job shrink it."
    ),
    "pydantic (models, JSON)": (
        "`JobRecord` is dumped to JSON for every store write and again for the response: "
        "dump once per state change and reuse the bytes."
    ),
    "arrays (shared memory)": (
        "`_Chunks._put` (`target[offset:end] = chunk`, arrays.py) copies each ASGI body "
        "chunk into a brand-new /dev/shm mapping, so every 4 KiB page is faulted in and "
        "zeroed on first touch: the data-path table shows the raw socket itself slowing "
        "down that much when it lands in a new /dev/shm file. Reuse pages instead of "
        "creating them: keep freed arrays' files in a free list by size and reuse them, or "
        "fault the next region in on a thread (`madvise(MADV_POPULATE_WRITE)`) while the "
        "socket is read. Then receive straight from the socket into the mapping, not per "
        "ASGI message (uvicorn, Starlette's stream and our counting wrapper are the rest)."
    ),
    "worker process: task, backend": (
        "(The workers' shares are mostly their two threads, the pipe reader and the slot, "
        "waiting to run after each wake-up; their CPU per job is the firmer number.) "
        "In the worker, every order goes through a `ThreadPoolExecutor.submit` to a slot "
        "thread (a Condition, a queue and a thread switch: `concurrent/futures/thread.py` "
        "lines are hot) for a task that itself takes microseconds. Run a job on the pipe "
        "thread when no other slot is busy, or give each slot a plain queue."
    ),
    "numpy (arrays)": (
        "In the client, `upload_array(ndarray)` first copies the whole array into a BytesIO "
        "with `np.save` (numpy's `write_array` is the hot line), then sends the copy: send "
        "the .npy header and then `memoryview(array)` itself, with Content-Length set, and "
        "the ndarray path costs what the ready-bytes path does."
    ),
    "client (taogpud.client, http.client)": (
        "In the client, `http.client` parses every response's headers through the email "
        "package (`parse_headers`, `FeedParser`) and reads through a buffered SocketIO: a "
        "small hand-written HTTP/1.1 reader over the socket (the echo floor shows what one "
        "round trip costs) would cut most of it."
    ),
}
