"""GET /file on Flask's built-in server: open().read() per request (seed 001)."""

import logging

from flask import Flask
from werkzeug import serving

import common

app = Flask(__name__)


@app.get("/file")
def file():
    with open(common.FILE) as f:
        return f.read()


if __name__ == "__main__":
    logging.getLogger("werkzeug").disabled = True
    serving.LISTEN_QUEUE = common.BACKLOG
    app.run(host=common.HOST, port=common.PORT, threaded=True)
