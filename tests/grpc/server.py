"""A gRPC server for tests/grpc.rs, without generated code: raw-bytes
methods of service demo.Echo. Prints "ready" once it listens.

    python server.py PORT
"""
import sys
import time
from concurrent import futures

import grpc


def say(request, context):
    return b"echo: " + request


def count(request, context):
    for i in range(int(request.decode())):
        yield f"item {i}".encode()


def fail(request, context):
    context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")


def slow(request, context):
    time.sleep(2)
    return b"too late"


def main():
    port = int(sys.argv[1])
    ident = lambda b: b  # noqa: E731 (bytes in, bytes out)
    handlers = {
        "Say": grpc.unary_unary_rpc_method_handler(say, ident, ident),
        "Count": grpc.unary_stream_rpc_method_handler(count, ident, ident),
        "Fail": grpc.unary_unary_rpc_method_handler(fail, ident, ident),
        "Slow": grpc.unary_unary_rpc_method_handler(slow, ident, ident),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("demo.Echo", handlers),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination(timeout=120)


if __name__ == "__main__":
    main()
