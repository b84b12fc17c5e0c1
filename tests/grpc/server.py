"""A gRPC server for tests/grpc.rs, without generated code: raw-bytes
methods of service demo.Echo, on a port the kernel chooses. Prints
"ready PORT" once it listens.

    python server.py
"""
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
    ident = lambda b: b  # noqa: E731 (bytes in, bytes out)
    handlers = {
        "Say": grpc.unary_unary_rpc_method_handler(say, ident, ident),
        "Count": grpc.unary_stream_rpc_method_handler(count, ident, ident),
        "Fail": grpc.unary_unary_rpc_method_handler(fail, ident, ident),
        "Slow": grpc.unary_unary_rpc_method_handler(slow, ident, ident),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("demo.Echo", handlers),))
    # Port 0: the kernel's choice, said on the ready line, so no port
    # probed beforehand can be taken by another test in the meantime.
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"ready {port}", flush=True)
    server.wait_for_termination(timeout=120)


if __name__ == "__main__":
    main()
