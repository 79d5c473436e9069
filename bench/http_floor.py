"""The floor for HTTP ingest from Python: uvicorn and FastAPI as ``fabricd server`` runs them
(fabricd/server/main.py: one process, httptools, no access log), a ``POST /api/v1/ingest`` that
reads the body, takes the one worker-thread hop ingest takes (fabricd/server/ingest.py), and
answers as ingest does, decoding and storing nothing. ``python bench/http_floor.py PORT``.

Whatever the central does per batch beyond this, it does on top of this cost: the ingest rows'
ratio to this row says how much of a batch's time is the service's own.
"""

from __future__ import annotations

import sys

import anyio.to_thread
import uvicorn
from fastapi import FastAPI, Request

app = FastAPI()


def _nothing(body: bytes) -> int:
    return len(body)


@app.post("/api/v1/ingest")
async def ingest(request: Request) -> dict[str, object]:
    await anyio.to_thread.run_sync(_nothing, await request.body())
    return {"batch_id": "", "accepted": 0, "duplicate": False}


@app.get("/readyz")
async def ready() -> dict[str, str]:
    return {"status": "ready"}


def main() -> None:
    config = uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[1]), log_config=None, access_log=False)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
