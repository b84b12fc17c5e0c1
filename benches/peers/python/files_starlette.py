"""GET /file on Starlette: anyio.Path.read_text per request (seed 001).

Run with uvicorn, one worker:

    uvicorn files_starlette:app --backlog 4096 --no-access-log
"""

from anyio import Path
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

import common


async def file(_request):
    return PlainTextResponse(await Path(common.FILE).read_text())


app = Starlette(routes=[Route("/file", file)])
