"""Calls demo.Echo (tests/grpc/server.py) through the gateway at ADDR over
h2c and prints one JSON object with what came back.

    python client.py ADDR
"""
import json
import sys
import time

import grpc


def main():
    out = {}
    with grpc.insecure_channel(sys.argv[1]) as channel:
        ident = lambda b: b  # noqa: E731
        say = channel.unary_unary("/demo.Echo/Say", request_serializer=ident, response_deserializer=ident)
        count = channel.unary_stream("/demo.Echo/Count", request_serializer=ident, response_deserializer=ident)
        fail = channel.unary_unary("/demo.Echo/Fail", request_serializer=ident, response_deserializer=ident)
        slow = channel.unary_unary("/demo.Echo/Slow", request_serializer=ident, response_deserializer=ident)
        out["say"] = say(b"hello", timeout=10).decode()
        out["count"] = [m.decode() for m in count(b"5", timeout=10)]
        try:
            fail(b"x", timeout=10)
            out["fail"] = "OK"
        except grpc.RpcError as e:
            out["fail"] = [e.code().name, e.details()]
        started = time.monotonic()
        try:
            slow(b"x", timeout=0.3)
            out["slow"] = "OK"
        except grpc.RpcError as e:
            out["slow"] = e.code().name
        out["slow_s"] = round(time.monotonic() - started, 3)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
