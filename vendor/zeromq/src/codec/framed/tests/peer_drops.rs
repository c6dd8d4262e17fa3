use super::*;
use crate::PeerDropReason;
use std::time::Duration;

/// A transport that never delivers a byte and never closes.
struct Silent;

impl AsyncRead for Silent {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Pending
    }
}

/// Options with `idle` and an observer recording every reported drop.
fn recording(idle: Option<Duration>) -> (Arc<SocketOptions>, Arc<Mutex<Vec<PeerDropReason>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    let mut options = SocketOptions::default();
    options.peer_drop_observer(Arc::new(move |reason| {
        sink.lock().unwrap().push(reason);
    }));
    if let Some(idle) = idle {
        options.idle_timeout(idle);
    }
    (Arc::new(options), seen)
}

#[tokio::test]
async fn an_established_silent_peer_times_out_once() {
    let (options, seen) = recording(Some(Duration::from_millis(20)));
    let mut reader = ZmqFramedRead::new(Box::new(Silent), options);
    reader.established();
    let first = tokio::time::timeout(Duration::from_secs(10), reader.next())
        .await
        .expect("the idle timeout fires");
    assert!(matches!(first, Some(Err(CodecError::IdleTimeout))));
    // The stream ends after its error, so the drop is reported once.
    assert!(reader.next().await.is_none());
    assert_eq!(*seen.lock().unwrap(), [PeerDropReason::IdleTimeout]);
}

#[tokio::test]
async fn a_failure_before_the_handshake_is_left_to_the_handshake() {
    // The reader reports nothing until established; the handshake reports its own failure.
    let (options, seen) = recording(None);
    // Ten bytes that are not a greeting signature: a decode error.
    let mut reader = ZmqFramedRead::new(Box::new(Cursor::new(vec![0u8; 10])), options);
    let first = reader.next().await;
    assert!(matches!(first, Some(Err(_))), "{first:?}");
    assert!(reader.next().await.is_none());
    assert!(seen.lock().unwrap().is_empty());
}

#[test]
fn errors_map_to_drop_reasons() {
    use crate::codec::{FRAME_TOO_LARGE, MESSAGE_TOO_LARGE};
    use crate::ZmqError;
    let reason = |e: CodecError| ZmqError::Codec(e).peer_drop_reason();
    assert_eq!(
        reason(CodecError::Decode(FRAME_TOO_LARGE)),
        Some(PeerDropReason::FrameTooLarge)
    );
    assert_eq!(
        reason(CodecError::Decode(MESSAGE_TOO_LARGE)),
        Some(PeerDropReason::MessageTooLarge)
    );
    assert_eq!(
        reason(CodecError::IdleTimeout),
        Some(PeerDropReason::IdleTimeout)
    );
    assert_eq!(
        reason(CodecError::Io(io::Error::from(
            io::ErrorKind::ConnectionReset
        ))),
        Some(PeerDropReason::Io)
    );
    assert_eq!(
        reason(CodecError::Decode("Unknown frame")),
        Some(PeerDropReason::Protocol)
    );
    assert_eq!(
        ZmqError::HandshakeTimeout(Duration::from_secs(1)).peer_drop_reason(),
        Some(PeerDropReason::HandshakeTimeout)
    );
    assert_eq!(
        ZmqError::Other(crate::error::HANDSHAKE_EOF).peer_drop_reason(),
        None
    );
}
