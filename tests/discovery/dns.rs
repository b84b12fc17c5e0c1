//! A DNS server for the tests, on a loopback UDP port, whose answers the
//! test changes while the gateway runs. Messages are read and written with
//! hickory-proto; the zone is a map of (name, type) to a reply. A name with
//! no entry is NXDOMAIN; a name with entries for other types answers
//! NOERROR with no records.
// Shared by discovery.rs and tls.rs, which use different parts of it.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::net::UdpSocket;

/// What the server answers for a (name, type).
#[derive(Debug, Clone)]
pub enum Reply {
    Records {
        data: Vec<RData>,
        ttl: u32,
    },
    /// Records of the names given, whatever name was asked.
    Owned {
        records: Vec<(String, RData)>,
        ttl: u32,
    },
    NxDomain,
    ServFail,
    /// No answer at all: the resolver times out.
    Silent,
}

type Zone = HashMap<(String, RecordType), Reply>;

pub struct TestDns {
    pub addr: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    queries: Arc<Mutex<Vec<(String, RecordType)>>>,
    gate: Arc<Gate>,
}

/// Names whose answers are held back until every one of them has been
/// asked (see [`TestDns::hold_until_all_asked`]).
#[derive(Default)]
struct Gate {
    /// The names held back, and those of them not asked yet; `None`: no gate.
    waiting: Mutex<Option<(HashSet<String>, HashSet<String>)>>,
    open: tokio::sync::Notify,
}

/// Lower case, without the final dot.
fn key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

impl TestDns {
    pub async fn start() -> TestDns {
        let socket = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let addr = socket.local_addr().unwrap();
        let zone: Arc<Mutex<Zone>> = Arc::default();
        let queries: Arc<Mutex<Vec<(String, RecordType)>>> = Arc::default();
        let gate: Arc<Gate> = Arc::default();
        let (z, q, g) = (zone.clone(), queries.clone(), gate.clone());
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            loop {
                let Ok((n, peer)) = socket.recv_from(&mut buf).await else { return };
                let Ok(request) = Message::from_vec(&buf[..n]) else { continue };
                let Some(query) = request.queries.first().cloned() else { continue };
                let name = key(&query.name().to_ascii());
                q.lock().unwrap().push((name.clone(), query.query_type()));
                let mut response = Message::response(request.metadata.id, request.metadata.op_code);
                response.metadata.recursion_desired = request.metadata.recursion_desired;
                response.metadata.recursion_available = true;
                response.metadata.authoritative = true;
                response.add_query(query.clone());
                let reply = {
                    let zone = z.lock().unwrap();
                    match zone.get(&(name.clone(), query.query_type())) {
                        Some(reply) => reply.clone(),
                        None if zone.keys().any(|(n, _)| *n == name) => Reply::Records { data: vec![], ttl: 0 },
                        None => Reply::NxDomain,
                    }
                };
                match reply {
                    Reply::Records { data, ttl } => {
                        for d in data {
                            response.add_answer(Record::from_rdata(query.name().clone(), ttl, d));
                        }
                    }
                    Reply::Owned { records, ttl } => {
                        for (owner, d) in records {
                            response.add_answer(Record::from_rdata(Name::from_ascii(&owner).unwrap(), ttl, d));
                        }
                    }
                    Reply::NxDomain => response.metadata.response_code = ResponseCode::NXDomain,
                    Reply::ServFail => response.metadata.response_code = ResponseCode::ServFail,
                    Reply::Silent => continue,
                }
                let bytes = response.to_vec().unwrap();
                if g.held(&name) {
                    let (g, socket) = (g.clone(), socket.clone());
                    tokio::spawn(async move {
                        g.opened().await;
                        let _ = socket.send_to(&bytes, peer).await;
                    });
                    continue;
                }
                let _ = socket.send_to(&bytes, peer).await;
            }
        });
        TestDns { addr, zone, queries, gate }
    }

    /// Answers for `names` are held back until each of them has been asked
    /// (then all go out): a client that asks them one after another, each
    /// waiting for its answer, gets none.
    pub fn hold_until_all_asked(&self, names: &[&str]) {
        let names: HashSet<String> = names.iter().map(|n| key(n)).collect();
        *self.gate.waiting.lock().unwrap() = Some((names.clone(), names));
    }

    pub fn set(&self, name: &str, rtype: RecordType, reply: Reply) {
        self.zone.lock().unwrap().insert((key(name), rtype), reply);
    }

    /// `name`'s A and AAAA records: the addresses in `ips` of each family.
    pub fn addresses(&self, name: &str, ips: &[&str], ttl: u32) {
        let ips: Vec<IpAddr> = ips.iter().map(|ip| ip.parse().unwrap()).collect();
        let v4 = ips.iter().filter_map(|ip| match ip {
            IpAddr::V4(v4) => Some(RData::A(A(*v4))),
            _ => None,
        });
        let v6 = ips.iter().filter_map(|ip| match ip {
            IpAddr::V6(v6) => Some(RData::AAAA(AAAA(*v6))),
            _ => None,
        });
        self.set(name, RecordType::A, Reply::Records { data: v4.collect(), ttl });
        self.set(name, RecordType::AAAA, Reply::Records { data: v6.collect(), ttl });
    }

    /// `name`'s SRV records: `(priority, weight, port, target)`.
    pub fn srv(&self, name: &str, records: &[(u16, u16, u16, &str)], ttl: u32) {
        let data = records
            .iter()
            .map(|(priority, weight, port, target)| {
                RData::SRV(SRV::new(*priority, *weight, *port, Name::from_ascii(target).unwrap()))
            })
            .collect();
        self.set(name, RecordType::SRV, Reply::Records { data, ttl });
    }

    /// Every type of `name` answers `reply`.
    pub fn all(&self, name: &str, reply: Reply) {
        for t in [RecordType::A, RecordType::AAAA, RecordType::SRV] {
            self.set(name, t, reply.clone());
        }
    }

    /// How many queries for (name, type) arrived.
    pub fn queries(&self, name: &str, rtype: RecordType) -> usize {
        let name = key(name);
        self.queries.lock().unwrap().iter().filter(|(n, t)| *n == name && *t == rtype).count()
    }
}

impl Gate {
    /// Whether the answer to a query for `name` waits: `name` is gated and
    /// some gated name has not been asked yet. Opens the gate once all were.
    fn held(&self, name: &str) -> bool {
        let mut waiting = self.waiting.lock().unwrap();
        let Some((gated, names)) = waiting.as_mut() else { return false };
        if !gated.contains(name) {
            return false;
        }
        names.remove(name);
        if names.is_empty() {
            *waiting = None;
            self.open.notify_waiters();
            return false;
        }
        true
    }

    /// Waits until the gate is open.
    async fn opened(&self) {
        loop {
            let notified = self.open.notified();
            if self.waiting.lock().unwrap().is_none() {
                return;
            }
            notified.await;
        }
    }
}
