"""A small authoritative DNS server whose answers come from a JSON file that
is read again on every query, so that a script can change what a name
resolves to while gateways keep asking it (scripts/across-machines.sh). A
real server on a real UDP socket: the gateways resolve through hickory as
they would against CoreDNS.

    python zone_dns.py ZONE.json ADDRESS PORT

ZONE.json maps a name (no final dot) to its records:

    {"app.test": {"A": ["10.77.0.21", "10.77.0.22"], "ttl": 1}}

A name that is not in the file is NXDOMAIN; a name whose type is not in
it (AAAA here) answers NOERROR with no records, as an authoritative
server does. A file that cannot be read or parsed (caught mid-write)
answers SERVFAIL, which the gateway treats as "keep what you have". Each
query is printed as one line: the time, the asker, name, type, and the
answer.

>>> zone = {"app.test": {"A": ["10.0.0.1", "10.0.0.2"], "ttl": 1}}
>>> [str(rr.rdata) for rr in answer(zone, DNSRecord.question("App.Test.")).rr]
['10.0.0.1', '10.0.0.2']
>>> answer(zone, DNSRecord.question("app.test", "AAAA")).header.rcode == RCODE.NOERROR
True
>>> answer(zone, DNSRecord.question("other.test")).header.rcode == RCODE.NXDOMAIN
True
"""

import json
import sys
import time

from dnslib import AAAA, QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSLogger, DNSServer

RDATA = {"A": A, "AAAA": AAAA}


def answer(zone, request):
    """The reply to `request` from `zone` (the parsed JSON)."""
    reply = request.reply()
    name = str(request.q.qname).rstrip(".").lower()
    entry = zone.get(name)
    if entry is None:
        reply.header.rcode = RCODE.NXDOMAIN
        return reply
    qtype = QTYPE[request.q.qtype]
    for address in entry.get(qtype, []) if qtype in RDATA else []:
        reply.add_answer(RR(request.q.qname, request.q.qtype, rdata=RDATA[qtype](address), ttl=entry.get("ttl", 1)))
    return reply


class ZoneFile(BaseResolver):
    def __init__(self, path):
        self.path = path

    def resolve(self, request, handler):
        try:
            with open(self.path) as f:
                zone = json.load(f)
        except (OSError, ValueError) as e:
            reply = request.reply()
            reply.header.rcode = RCODE.SERVFAIL
            log(handler, request, f"SERVFAIL ({e})")
            return reply
        reply = answer(zone, request)
        log(handler, request, " ".join(str(rr.rdata) for rr in reply.rr) or RCODE[reply.header.rcode])
        return reply


def log(handler, request, answer):
    now = time.time()
    stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
    print(f"{stamp} {handler.client_address[0]} {request.q.qname} {QTYPE[request.q.qtype]} {answer}", flush=True)


def main():
    path, address, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    # Only errors from dnslib itself: the resolver prints one line a query.
    server = DNSServer(ZoneFile(path), address=address, port=port, logger=DNSLogger("error", prefix=False))
    print(f"serving {path} on {address}:{port}/udp", flush=True)
    server.start()


if __name__ == "__main__":
    main()
