"""Service B on Flask's built-in server, threaded, one process (seed 000).

Flask runs `async def` views in a new event loop per request (asgiref), so
the shared-client routes do not apply here; only the article's four exist.
"""

import logging

from flask import Flask
from werkzeug import serving

import common

app = Flask(__name__)


def sync_handler(fetch):
    def handler():
        status, body = common.call_sync(fetch)
        return body, status

    return handler


def async_handler(fetch):
    async def handler():
        status, body = await common.call_async(fetch)
        return body, status

    return handler


for path, fetch in common.SYNC_ROUTES.items():
    app.get(path, endpoint=path)(sync_handler(fetch))
for path, fetch in common.ARTICLE_ASYNC_ROUTES.items():
    app.get(path, endpoint=path)(async_handler(fetch))

if __name__ == "__main__":
    logging.getLogger("werkzeug").disabled = True
    # werkzeug's listen backlog is a module constant (128 by default).
    serving.LISTEN_QUEUE = common.BACKLOG
    app.run(host=common.HOST, port=common.PORT, threaded=True)
