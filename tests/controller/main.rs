//! The LMCache controller (`kvplane serve`) in process: its ZMQ sockets, its HTTP routes
//! (through `oneshot` and over real sockets) and the worker library against it. One test
//! binary; each module is one area, all share `tests/support`.

#[path = "../support/mod.rs"]
mod support;

mod http;
mod http_commands;
mod http_e2e;
mod worker;
mod zmq;
