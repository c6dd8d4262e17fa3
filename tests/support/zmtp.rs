//! ZMTP 3.0 bytes for raw TCP peers in the transport tests: what a well-behaved peer sends
//! first, and frame headers to break the limits with.

/// A ZMTP 3.0 NULL-mechanism greeting.
pub fn zmtp_greeting() -> Vec<u8> {
    let mut greeting = vec![0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting[12..16].copy_from_slice(b"NULL");
    greeting
}

/// A ZMTP READY command frame announcing `socket_type`.
pub fn zmtp_ready(socket_type: &str) -> Vec<u8> {
    let mut body = vec![5];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    let mut frame = vec![0x04, body.len() as u8];
    frame.extend_from_slice(&body);
    frame
}

/// A ZMTP frame header: flags, then a one-byte or (past 255) an eight-byte length.
pub fn zmtp_header(len: u64, more: bool, command: bool) -> Vec<u8> {
    let flags = u8::from(more) | if command { 0x04 } else { 0 };
    match u8::try_from(len) {
        Ok(short) => vec![flags, short],
        Err(_) => {
            let mut header = vec![flags | 0x02];
            header.extend_from_slice(&len.to_be_bytes());
            header
        }
    }
}

/// A greeting and a READY as `socket_type`: what a well-behaved peer sends first.
pub fn zmtp_handshake(socket_type: &str) -> Vec<u8> {
    let mut bytes = zmtp_greeting();
    bytes.extend_from_slice(&zmtp_ready(socket_type));
    bytes
}
