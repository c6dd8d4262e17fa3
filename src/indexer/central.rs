//! The central topology (`--bind`): SUB sockets the indexer binds and publishers connect to,
//! as llm-d's scheduler does. Each message's topic (`kv@<address>@<model>` by default,
//! [`TopicPattern`]) names its instance: the first message of a new topic registers it, or
//! adopts the explicit `/register` whose endpoint is `tcp://<address>`, and from then on the
//! socket's task hands that topic's messages to the instance's applier
//! ([`super::publisher`]), which runs the same sequence tracking, replay and restart
//! detection as for a subscribed publisher.
//!
//! Owns the topic pattern, the bound sockets' tasks and the topic → applier routes. Must not
//! decode events (the applier does) or wait on one instance's queue (the socket is shared: a
//! full queue drops the message, counted, and the gap is replayed). Bounded: a topic longer
//! than [`MAX_TOPIC_BYTES`], one that does not match, and instances beyond
//! `--max-topic-instances` are refused and counted in `kvplane_indexer_topic_refused_total`.

use super::api::{EngineType, Registration};
use super::publisher::ApplierQueue;
use super::state::Registry;
use super::IndexerState;
use crate::service::StartError;
use crate::transport::{BoundSubscriber, TransportLimits};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The longest topic accepted, bytes (an address and a model name fit many times over).
pub(crate) const MAX_TOPIC_BYTES: usize = 512;

/// One piece of a topic pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Address,
    Model,
}

/// How a topic names its instance: literal text around `{address}` and `{model}`, each
/// exactly once. A placeholder takes the text up to the first occurrence of the literal
/// after it (the last one takes the rest), and must not be empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicPattern {
    pieces: Vec<Piece>,
    text: String,
}

impl Default for TopicPattern {
    fn default() -> Self {
        Self::parse(crate::config::defaults::indexer::TOPIC_PATTERN).expect("the default parses")
    }
}

impl std::fmt::Display for TopicPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl TopicPattern {
    /// Parses a pattern such as `kv@{address}@{model}`.
    ///
    /// # Errors
    /// A placeholder missing, repeated or unknown, or two placeholders with no text between.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest
                        .find('}')
                        .ok_or_else(|| format!("{text:?}: a `{{` is not closed"))?;
                    let piece = match &rest[1..end] {
                        "address" => Piece::Address,
                        "model" => Piece::Model,
                        other => {
                            return Err(format!(
                                "{text:?}: unknown placeholder {{{other}}} (use {{address}} and {{model}})"
                            ))
                        }
                    };
                    if pieces.last().is_some_and(|p| !matches!(p, Piece::Text(_))) {
                        return Err(format!(
                            "{text:?}: two placeholders need literal text between them"
                        ));
                    }
                    pieces.push(piece);
                    rest = &rest[end + 1..];
                }
                Some(i) => {
                    pieces.push(Piece::Text(rest[..i].to_owned()));
                    rest = &rest[i..];
                }
                None => {
                    pieces.push(Piece::Text(rest.to_owned()));
                    rest = "";
                }
            }
        }
        for want in [Piece::Address, Piece::Model] {
            let n = pieces.iter().filter(|p| **p == want).count();
            if n != 1 {
                return Err(format!(
                    "{text:?}: {{address}} and {{model}} must each appear exactly once"
                ));
            }
        }
        Ok(Self {
            pieces,
            text: text.to_owned(),
        })
    }

    /// The address and model a topic names; `None` when it does not match.
    pub fn names<'t>(&self, topic: &'t str) -> Option<(&'t str, &'t str)> {
        let (mut address, mut model) = (None, None);
        let mut rest = topic;
        let mut i = 0;
        while i < self.pieces.len() {
            match &self.pieces[i] {
                Piece::Text(t) => rest = rest.strip_prefix(t.as_str())?,
                slot => {
                    let taken = match self.pieces.get(i + 1) {
                        Some(Piece::Text(next)) => &rest[..rest.find(next.as_str())?],
                        _ => rest,
                    };
                    if taken.is_empty() {
                        return None;
                    }
                    rest = &rest[taken.len()..];
                    if *slot == Piece::Address {
                        address = Some(taken);
                    } else {
                        model = Some(taken);
                    }
                }
            }
            i += 1;
        }
        if !rest.is_empty() {
            return None;
        }
        Some((address?, model?))
    }
}

/// `--bind` and the topic settings.
#[derive(Clone, Debug)]
pub struct CentralConfig {
    /// Addresses to bind SUB sockets on.
    pub binds: Vec<String>,
    /// How a topic names its instance.
    pub pattern: TopicPattern,
    /// Tokens per block of an instance registered by its topic.
    pub block_size: u32,
    /// Instances registered by their topic at most.
    pub max_instances: usize,
}

impl Default for CentralConfig {
    fn default() -> Self {
        use crate::config::defaults::indexer as d;
        Self {
            binds: Vec::new(),
            pattern: TopicPattern::default(),
            block_size: d::TOPIC_BLOCK_SIZE,
            max_instances: d::MAX_TOPIC_INSTANCES,
        }
    }
}

/// Why a message on a bound socket went nowhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TopicRefusal {
    /// Fewer than three frames (topic, sequence, payload).
    TooFewFrames,
    /// Longer than [`MAX_TOPIC_BYTES`].
    TooLong,
    /// Not UTF-8, or not of the pattern's form.
    NoMatch,
    /// `--max-topic-instances` are registered by topic already.
    InstanceCap,
    /// The instance's endpoint is already fed by another bound socket, or its registration
    /// was refused (a conflicting key, `--max-services`).
    Conflict,
}

impl TopicRefusal {
    fn label(self) -> &'static str {
        match self {
            TopicRefusal::TooFewFrames => "too_few_frames",
            TopicRefusal::TooLong => "topic_too_long",
            TopicRefusal::NoMatch => "no_match",
            TopicRefusal::InstanceCap => "instance_cap",
            TopicRefusal::Conflict => "conflict",
        }
    }
}

/// Counts refusals by reason and logs the first of each reason, then one in 1,000.
#[derive(Debug, Default)]
pub struct TopicCounters {
    refused: [AtomicU64; 5],
}

impl TopicCounters {
    const REASONS: [TopicRefusal; 5] = [
        TopicRefusal::TooFewFrames,
        TopicRefusal::TooLong,
        TopicRefusal::NoMatch,
        TopicRefusal::InstanceCap,
        TopicRefusal::Conflict,
    ];

    fn count(&self, why: TopicRefusal, topic: &[u8]) {
        let i = Self::REASONS.iter().position(|r| *r == why).unwrap_or(0);
        let n = self.refused[i].fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(1000) {
            let shown = String::from_utf8_lossy(&topic[..topic.len().min(MAX_TOPIC_BYTES)]);
            tracing::warn!(
                topic = %shown,
                reason = why.label(),
                refused = n + 1,
                "a message on a --bind socket was dropped (kvplane_indexer_topic_refused_total)"
            );
        }
    }

    /// `(reason, count)` for `/metrics`.
    pub fn by_reason(&self) -> Vec<(&'static str, u64)> {
        Self::REASONS
            .iter()
            .zip(&self.refused)
            .map(|(r, n)| (r.label(), n.load(Ordering::Relaxed)))
            .collect()
    }
}

/// Binds every `--bind` address (a failure stops the start) and spawns one task per socket.
/// Returns the addresses bound.
pub(super) async fn start(state: &Arc<IndexerState>) -> Result<Vec<SocketAddr>, StartError> {
    let mut bound = Vec::new();
    if state.role.is_replica() {
        if !state.config.central.binds.is_empty() {
            tracing::warn!("--bind ignored: a replica follows the ingester's registrations");
        }
        return Ok(bound);
    }
    let limits = TransportLimits::with_max_frame_bytes(state.config.max_frame_bytes);
    for (index, addr) in state.config.central.binds.iter().enumerate() {
        let (socket, local) = BoundSubscriber::bind(addr, &limits)
            .await
            .map_err(|e| StartError::Config(format!("--bind {addr}: {e}")))?;
        tracing::info!(bind = %addr, addr = %local, "indexer SUB socket bound: publishers connect here");
        state.tasks.spawn(receive(Arc::clone(state), index, socket));
        bound.push(local);
    }
    Ok(bound)
}

/// One bound socket's task: topic → applier, for as long as the indexer runs.
async fn receive(state: Arc<IndexerState>, index: usize, mut socket: BoundSubscriber) {
    // Only topics that reached an applier are kept, so this is bounded by the instances.
    let mut routes: HashMap<Bytes, ApplierQueue> = HashMap::new();
    let cancel = state.shutdown.clone();
    loop {
        let frames = tokio::select! {
            () = cancel.cancelled() => return,
            f = socket.next() => f,
        };
        let Some(topic) = frames.first().cloned() else {
            continue;
        };
        if frames.len() < 3 {
            state
                .metrics
                .topics
                .count(TopicRefusal::TooFewFrames, &topic);
            continue;
        }
        // A route whose applier went (unregistered, replaced by a registration) is resolved
        // again.
        let feed = match routes.get(&topic).filter(|f| !f.is_closed()) {
            Some(feed) => feed.clone(),
            None => {
                routes.remove(&topic);
                match resolve(&state, index, &topic, &frames) {
                    Ok(feed) => {
                        feed.offer_connected();
                        routes.insert(topic, feed.clone());
                        feed
                    }
                    Err(why) => {
                        state.metrics.topics.count(why, &topic);
                        continue;
                    }
                }
            }
        };
        // Queued, or dropped and counted (the gap is replayed); a queue that closed just now
        // loses this one message, which the next applier's replay brings back.
        let _ = feed.offer(frames);
    }
}

/// Finds or registers the instance a topic names.
fn resolve(
    state: &Arc<IndexerState>,
    index: usize,
    topic: &[u8],
    frames: &[Bytes],
) -> Result<ApplierQueue, TopicRefusal> {
    if topic.len() > MAX_TOPIC_BYTES {
        return Err(TopicRefusal::TooLong);
    }
    let topic = std::str::from_utf8(topic).map_err(|_| TopicRefusal::NoMatch)?;
    let central = &state.config.central;
    let (address, model) = central.pattern.names(topic).ok_or(TopicRefusal::NoMatch)?;
    if address.chars().any(char::is_control) || model.chars().any(char::is_control) {
        return Err(TopicRefusal::NoMatch);
    }
    let endpoint = format!("tcp://{address}");
    if let Some(feed) = adopt(&mut state.registry.lock(), &endpoint, index)? {
        return Ok(feed);
    }
    let by_topic = state
        .registry
        .lock()
        .publishers
        .values()
        .filter(|p| p.by_topic)
        .count();
    if by_topic >= central.max_instances {
        return Err(TopicRefusal::InstanceCap);
    }
    // The rank is the batch's own (vLLM stamps it); 0 when it names none.
    let dp_rank = crate::indexer::model::frames::split(frames)
        .ok()
        .and_then(|(_, payload)| crate::indexer::model::events::decode_batch(&payload).ok())
        .and_then(|b| b.dp_rank)
        .and_then(|r| u32::try_from(r).ok())
        .unwrap_or(0);
    let reg = Registration {
        endpoint: endpoint.clone(),
        replay_endpoint: None,
        kind: EngineType::Vllm,
        model: model.to_owned(),
        lora: String::new(),
        tenant: "default".into(),
        instance: address.to_owned(),
        block_size: central.block_size,
        dp_rank,
        salt: String::new(),
        lmcache: Vec::new(),
        http: None,
        backends: Vec::new(),
    };
    if let Err(e) = state.register_as(reg, true) {
        tracing::warn!(%topic, "instance of a topic not registered: {e}");
        return Err(TopicRefusal::Conflict);
    }
    tracing::info!(%topic, instance = address, model, dp_rank, "instance registered by its topic");
    adopt(&mut state.registry.lock(), &endpoint, index)?.ok_or(TopicRefusal::Conflict)
}

/// The feed of the publisher registered at `endpoint`, now known to connect to bound socket
/// `index` (its own receiver, if any, stops). `Ok(None)`: none registered there.
fn adopt(
    registry: &mut Registry,
    endpoint: &str,
    index: usize,
) -> Result<Option<ApplierQueue>, TopicRefusal> {
    let Some(p) = registry.publishers.get_mut(endpoint) else {
        return Ok(None);
    };
    match p.bound {
        Some(i) if i != index => Err(TopicRefusal::Conflict),
        _ => {
            if p.bound.is_none() {
                tracing::info!(
                    endpoint,
                    "the registered publisher connects to a --bind socket: not subscribing to it"
                );
            }
            p.bound = Some(index);
            p.receiver.cancel();
            Ok(Some(p.feed.clone()))
        }
    }
}

impl IndexerState {
    /// Before an explicit registration of `reg`'s endpoint: when an instance registered by
    /// its topic holds that endpoint, removes it (its blocks go) and returns the bound socket
    /// it arrives on, so that the registration keeps receiving from there.
    pub(super) fn replace_topic_instance(
        &self,
        registry: &mut Registry,
        reg: &Registration,
    ) -> Option<usize> {
        let p = registry.publishers.get(&reg.endpoint)?;
        if !p.by_topic {
            return p.bound;
        }
        let bound = p.bound;
        let keys: Vec<String> = registry
            .services
            .iter()
            .filter(|(_, s)| s.reg.endpoint == reg.endpoint)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &keys {
            self.drop_service(registry, key);
        }
        tracing::info!(
            endpoint = %reg.endpoint,
            "an explicit registration replaces the instance registered by its topic"
        );
        bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llm_d_topics_name_address_and_model() {
        let p = TopicPattern::default();
        assert_eq!(
            p.names("kv@10.0.0.5:8000@Qwen/Qwen3-8B"),
            Some(("10.0.0.5:8000", "Qwen/Qwen3-8B"))
        );
        assert_eq!(p.names("kv@pod-a@m"), Some(("pod-a", "m")));
        // The model takes the rest, `@` included.
        assert_eq!(p.names("kv@a@m@v2"), Some(("a", "m@v2")));
        for bad in ["", "kv@", "kv@@m", "kv@a@", "kv@a", "xx@a@m", "kv.a.m"] {
            assert_eq!(p.names(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn patterns_are_checked() {
        let p = TopicPattern::parse("{model}|{address}/events").expect("parses");
        assert_eq!(p.names("m|pod:1/events"), Some(("pod:1", "m")));
        assert_eq!(p.names("m|pod:1/event"), None);
        assert_eq!(p.to_string(), "{model}|{address}/events");
        for bad in [
            "kv@{address}",
            "kv@{address}{model}",
            "kv@{address}@{address}@{model}",
            "kv@{pod}@{model}",
            "kv@{address@{model}",
        ] {
            assert!(TopicPattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn refusals_are_counted_by_reason() {
        let c = TopicCounters::default();
        c.count(TopicRefusal::InstanceCap, b"kv@a@m");
        c.count(TopicRefusal::InstanceCap, b"kv@b@m");
        c.count(TopicRefusal::TooLong, &[b'x'; 600]);
        let by: HashMap<_, _> = c.by_reason().into_iter().collect();
        assert_eq!(by["instance_cap"], 2);
        assert_eq!(by["topic_too_long"], 1);
        assert_eq!(by["no_match"], 0);
    }
}
