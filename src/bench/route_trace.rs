//! Mooncake-format request traces for `kvplane bench route` (issue 23; the replay itself is
//! not built yet): one JSON object per line, `{timestamp, input_length, output_length,
//! hash_ids}`, each hash id one 512-token block, equal ids meaning an equal prefix. Pure:
//! parsing with bounds, the prompt's token ids derived deterministically from the hash ids
//! (equal ids give equal tokens), and the reuse an unbounded cache would see (the ceiling any
//! router's hit ratio stays under).

use std::collections::HashSet;

/// Tokens per hash id in Mooncake's traces.
pub const TRACE_BLOCK: u32 = 512;
/// Requests read at most from one trace.
pub const MAX_REQUESTS: usize = 1 << 20;
/// The longest prompt accepted, tokens.
pub const MAX_INPUT: u32 = 1 << 21;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct TraceRequest {
    /// Arrival, milliseconds from the trace's start.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Tokens to generate.
    pub output_length: u32,
    /// One id per 512-token block of the prompt (the last may be partial).
    pub hash_ids: Vec<u64>,
}

/// A line that is not a valid request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("trace line {line}: {message}")]
pub struct TraceError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// Parses a whole trace (blank lines skipped); every request checked: as many hash ids as
/// 512-token blocks, a prompt of at most [`MAX_INPUT`] tokens, timestamps not going back.
///
/// # Errors
/// The first bad line, or more than [`MAX_REQUESTS`] requests.
pub fn parse(text: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let err = |message: String| TraceError { line, message };
        if raw.trim().is_empty() {
            continue;
        }
        if out.len() == MAX_REQUESTS {
            return Err(err(format!("more than {MAX_REQUESTS} requests")));
        }
        let r: TraceRequest = serde_json::from_str(raw).map_err(|e| err(e.to_string()))?;
        if r.input_length == 0 || r.input_length > MAX_INPUT {
            return Err(err(format!(
                "input_length {} is not within 1..={MAX_INPUT}",
                r.input_length
            )));
        }
        let blocks = r.input_length.div_ceil(TRACE_BLOCK) as usize;
        if r.hash_ids.len() != blocks {
            return Err(err(format!(
                "{} hash ids for {} tokens ({blocks} blocks of {TRACE_BLOCK})",
                r.hash_ids.len(),
                r.input_length
            )));
        }
        if out
            .last()
            .is_some_and(|p: &TraceRequest| p.timestamp > r.timestamp)
        {
            return Err(err("timestamps go back".into()));
        }
        out.push(r);
    }
    Ok(out)
}

/// SplitMix64: a fixed, well-mixed function of its input.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Token ids of a trace request as `bench route` sends them (clear of small special-token ids).
pub fn request_tokens(r: &TraceRequest) -> Vec<u32> {
    tokens(r, 1000, 30_000)
}

/// The prompt's token ids: token `j` of the block with id `h` is a fixed function of
/// `(h, j)`, in `[first, first + span)` (keep clear of a vocabulary's special tokens); the
/// last block is cut at `input_length`.
pub fn tokens(r: &TraceRequest, first: u32, span: u32) -> Vec<u32> {
    let span = u64::from(span.max(1));
    let mut out = Vec::with_capacity(r.input_length as usize);
    for &h in &r.hash_ids {
        let seed = mix(h);
        for j in 0..u64::from(TRACE_BLOCK) {
            if out.len() == r.input_length as usize {
                return out;
            }
            out.push(first + (mix(seed ^ j) % span) as u32);
        }
    }
    out
}

/// What a trace offers to reuse.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reuse {
    /// Requests.
    pub requests: u64,
    /// Prompt tokens, summed.
    pub input_tokens: u64,
    /// Tokens of whole leading blocks whose id an earlier request had: what one cache that
    /// never evicts could reuse (every router's hit ratio stays under it).
    pub reusable_tokens: u64,
    /// The last arrival, milliseconds.
    pub duration_ms: u64,
}

impl Reuse {
    /// `reusable_tokens / input_tokens`.
    pub fn ratio(&self) -> f64 {
        if self.input_tokens == 0 {
            0.0
        } else {
            self.reusable_tokens as f64 / self.input_tokens as f64
        }
    }
}

/// The reuse of a trace under one unbounded cache (whole blocks only).
pub fn reuse(trace: &[TraceRequest]) -> Reuse {
    let mut seen: HashSet<u64> = HashSet::new();
    let mut r = Reuse::default();
    for req in trace {
        let full = (req.input_length / TRACE_BLOCK) as usize;
        let hit = req
            .hash_ids
            .iter()
            .take(full)
            .take_while(|h| seen.contains(h))
            .count();
        r.requests += 1;
        r.input_tokens += u64::from(req.input_length);
        r.reusable_tokens += hit as u64 * u64::from(TRACE_BLOCK);
        r.duration_ms = r.duration_ms.max(req.timestamp);
        seen.extend(req.hash_ids.iter().copied());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_checked() {
        let ok = r#"{"timestamp": 0, "input_length": 513, "output_length": 2, "hash_ids": [1, 2]}

{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [1]}"#;
        let t = parse(ok).expect("valid");
        assert_eq!(t.len(), 2);
        let few =
            r#"{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}"#;
        assert_eq!(parse(few).unwrap_err().line, 1);
        let back = "{\"timestamp\": 9, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n\
                    {\"timestamp\": 3, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}";
        assert_eq!(
            parse(back).unwrap_err(),
            TraceError {
                line: 2,
                message: "timestamps go back".into()
            }
        );
        assert!(parse("{\"timestamp\": -1}").is_err());
        let empty = r#"{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}"#;
        assert!(parse(empty).is_err());
    }

    #[test]
    fn equal_ids_give_equal_tokens_and_lengths_hold() {
        let a = TraceRequest {
            timestamp: 0,
            input_length: 600,
            output_length: 1,
            hash_ids: vec![7, 8],
        };
        let b = TraceRequest {
            hash_ids: vec![7, 9],
            ..a.clone()
        };
        let (ta, tb) = (tokens(&a, 1000, 20_000), tokens(&b, 1000, 20_000));
        assert_eq!((ta.len(), tb.len()), (600, 600));
        assert_eq!(ta[..512], tb[..512]);
        assert_ne!(ta[512..], tb[512..]);
        assert!(ta.iter().all(|t| (1000..21_000).contains(t)));
        // Deterministic across calls (and runs: no seed from the clock).
        assert_eq!(ta, tokens(&a, 1000, 20_000));
    }

    #[test]
    fn reuse_counts_leading_whole_blocks_seen_before() {
        let req = |ids: Vec<u64>, len: u32| TraceRequest {
            timestamp: 0,
            input_length: len,
            output_length: 1,
            hash_ids: ids,
        };
        let t = [
            req(vec![1, 2, 3], 1536),
            req(vec![1, 2, 4], 1536),
            req(vec![5, 2], 1024),
            req(vec![1, 2], 1000),
        ];
        let r = reuse(&t);
        // 2 blocks, then 0 (first id new), then 1 (the partial second block never counts).
        assert_eq!(r.reusable_tokens, 3 * 512);
        assert_eq!(r.input_tokens, 1536 * 2 + 1024 + 1000);
    }

    #[test]
    fn the_mooncake_trace_parses_and_offers_its_reuse() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/traces/mooncake_synthetic_trace.jsonl"
        );
        let text = std::fs::read_to_string(path).expect("the trace is in the repository");
        let t = parse(&text).expect("valid trace");
        let r = reuse(&t);
        assert_eq!(r.requests, 3993);
        assert_eq!(r.duration_ms, 1_022_025);
        assert_eq!(r.input_tokens, 61_194_628);
        // Computed independently in Python over the same file (see ORIGIN.md).
        assert_eq!(r.reusable_tokens, 39_802_880);
    }
}
