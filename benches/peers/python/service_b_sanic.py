"""Service B on Sanic, 4 workers (seed 000).

Sanic calls a plain `def` handler on its event loop, so the two sync
clients block the whole worker while they wait: that is the article's finding.
"""

from sanic import Sanic
from sanic.response import text

import common

app = Sanic("service_b")


@app.before_server_start
async def open_clients(_app):
    await common.SHARED.open()


@app.after_server_stop
async def close_clients(_app):
    await common.SHARED.close()


def sync_handler(fetch):
    def handler(_request):
        status, body = common.call_sync(fetch)
        return text(body, status=status)

    return handler


def async_handler(fetch):
    async def handler(_request):
        status, body = await common.call_async(fetch)
        return text(body, status=status)

    return handler


for path, fetch in common.SYNC_ROUTES.items():
    app.get(path, name=path.strip("/"))(sync_handler(fetch))
for path, fetch in common.ASYNC_ROUTES.items():
    app.get(path, name=path.strip("/"))(async_handler(fetch))

if __name__ == "__main__":
    app.run(
        host=common.HOST,
        port=common.PORT,
        workers=common.WORKERS,
        backlog=common.BACKLOG,
        access_log=False,
        debug=False,
        motd=False,
    )
