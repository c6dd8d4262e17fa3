use super::*;

fn codec_with_limits(max_frame: usize, max_message: usize) -> ZmqCodec {
    let mut options = SocketOptions::default();
    options
        .max_frame_size(max_frame)
        .max_message_size(max_message);
    let mut codec = ZmqCodec::with_options(&options);
    codec.state = DecoderState::FrameHeader;
    codec.waiting_for = 1;
    codec
}

fn frames(count: usize, len: u8, more: bool) -> BytesMut {
    let mut input = BytesMut::new();
    for i in 0..count {
        input.extend_from_slice(&[u8::from(more || i + 1 < count), len]);
        input.resize(input.len() + usize::from(len), 7);
    }
    input
}

#[test]
fn a_frame_over_the_limit_is_rejected_from_its_header() {
    // Message and command frames alike, whatever the claim; nothing is reserved for them.
    for (flags, len) in [(0b010, 101_u64), (0b110, 101), (0b011, 1 << 40)] {
        let mut codec = codec_with_limits(100, 1000);
        let mut input = BytesMut::from(&[flags][..]);
        input.extend_from_slice(&len.to_be_bytes());
        assert!(matches!(
            codec.decode(&mut input),
            Err(CodecError::Decode("Frame exceeds the maximum frame size"))
        ));
        assert!(input.capacity() <= 2 * MIN_READ_AHEAD);
    }
    let mut codec = codec_with_limits(100, 1000);
    let mut at_limit = frames(1, 100, false);
    assert!(matches!(
        codec.decode(&mut at_limit),
        Ok(Some(Message::Message(_)))
    ));
}

#[test]
fn a_message_over_the_limit_is_rejected() {
    let mut codec = codec_with_limits(100, 100);
    let mut input = frames(3, 40, false);
    assert!(matches!(
        codec.decode(&mut input),
        Err(CodecError::Decode(
            "Message exceeds the maximum message size"
        ))
    ));
    // Empty frames count as the size of their handle, so endless MORE frames end too.
    let handle = std::mem::size_of::<Bytes>();
    let mut codec = codec_with_limits(100, 1000 * handle);
    let mut input = frames(1001, 0, true);
    assert!(matches!(
        codec.decode(&mut input),
        Err(CodecError::Decode(
            "Message exceeds the maximum message size"
        ))
    ));
    // The count starts again with each message.
    let mut codec = codec_with_limits(100, 100);
    let mut input = BytesMut::new();
    for _ in 0..10 {
        input.extend_from_slice(&frames(1, 60, false));
    }
    input.extend_from_slice(&frames(1, 0, false));
    for _ in 0..11 {
        assert!(matches!(
            codec.decode(&mut input),
            Ok(Some(Message::Message(_)))
        ));
    }
}
