"""Service B on FastAPI (seed 000). Run with uvicorn, 4 workers:

uvicorn service_b_fastapi:app --workers 4 --backlog 4096 --no-access-log
"""

from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

import common


@asynccontextmanager
async def lifespan(_app):
    await common.SHARED.open()
    yield
    await common.SHARED.close()


app = FastAPI(lifespan=lifespan)


def sync_handler(fetch):
    def handler():
        status, body = common.call_sync(fetch)
        return PlainTextResponse(body, status_code=status)

    return handler


def async_handler(fetch):
    async def handler():
        status, body = await common.call_async(fetch)
        return PlainTextResponse(body, status_code=status)

    return handler


for path, fetch in common.SYNC_ROUTES.items():
    app.get(path)(sync_handler(fetch))
for path, fetch in common.ASYNC_ROUTES.items():
    app.get(path)(async_handler(fetch))
