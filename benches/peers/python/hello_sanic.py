"""Hello world on Sanic, one worker (seed 002)."""

from sanic import Sanic
from sanic.response import text

import common

app = Sanic("hello")


@app.get("/hello")
async def hello(_request):
    return text(common.HELLO)


if __name__ == "__main__":
    app.run(
        host=common.HOST,
        port=common.PORT,
        workers=1,
        backlog=common.BACKLOG,
        access_log=False,
        debug=False,
        motd=False,
    )
