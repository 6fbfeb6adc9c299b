//! Plain HTTP/1.0 GETs on loopback for the tests: the agent's and the console's `/metrics`
//! listeners, and the health listener.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET path` (HTTP/1.0: the server closes the connection after a body never sent chunked;
/// 10 s read timeout); returns the status code and the
/// body.
pub fn http_response(addr: SocketAddr, path: &str) -> (u16, String) {
    http_response_with(addr, path, &[])
}

/// [`http_response`] with more request headers (`Authorization: Bearer ...`).
pub fn http_response_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n{extra}\r\n").expect("send");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let (head, body) =
        out.split_once("\r\n\r\n").unwrap_or_else(|| panic!("GET {path}: no header end: {out:?}"));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("GET {path}: no status code: {head:?}"));
    (code, body.to_owned())
}

/// `GET path`, which must answer 200; returns the body.
pub fn http_get(addr: SocketAddr, path: &str) -> String {
    let (code, body) = http_response(addr, path);
    assert_eq!(code, 200, "GET {path}: {body}");
    body
}
