"""GET /file on aiohttp.web: aiofiles read per request (seed 001)."""

import aiofiles
from aiohttp import web

import common

routes = web.RouteTableDef()


@routes.get("/file")
async def file(_request):
    async with aiofiles.open(common.FILE) as f:
        return web.Response(text=await f.read())


if __name__ == "__main__":
    app = web.Application()
    app.add_routes(routes)
    web.run_app(
        app,
        host=common.HOST,
        port=common.PORT,
        backlog=common.BACKLOG,
        access_log=None,
        print=None,
    )
